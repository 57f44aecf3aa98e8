use super::render::render;
use super::*;

fn stats(waiting: u64, rate: f64) -> QueueStats {
    QueueStats {
        waiting_count: waiting,
        admitted_count: 0,
        admission_rate_per_sec: rate,
        avg_wait_seconds: 0.0,
        p95_wait_seconds: 0.0,
        evicted_count: 0,
        batch_size: 100,
        tick_ms: 2000,
        target_rate_per_sec: 50.0,
        max_capacity: 1000,
        tokens_issued: 0,
        tokens_used: 0,
        direct_tokens_used: 0,
        sale_state: None,
        opens_at: None,
        prequeued_count: None,
        outflow: "fixed".into(),
        outflow_reason: None,
        tokens_expired: 0,
        outflow_signals: None,
        lanes: Vec::new(),
    }
}

/// A queue whose longest waiter has waited a minute, admitting `rate` per second.
fn seen(rate: f64) -> RateSeen {
    RateSeen { longest_wait_ms: 60_000, recent_rate: rate }
}

#[test]
fn rows_over_90_percent_or_under_half_rate_are_flagged() {
    assert_eq!(alerts_of(&stats(901, 50.0), &seen(50.0)), vec!["OVER_CAPACITY_90"]);
    assert_eq!(alerts_of(&stats(500, 24.0), &seen(24.0)), vec!["RATE_UNDER_50"]);
    assert!(alerts_of(&stats(500, 25.0), &seen(25.0)).is_empty());
    assert!(alerts_of(&stats(10, 0.0), &seen(0.0)).is_empty(), "fewer than a batch waiting is no slowness");
}

#[test]
fn no_rate_alert_while_the_sale_holds_admission_or_the_queue_is_younger_than_three_ticks() {
    for state in [SaleState::Scheduled, SaleState::PreQueue, SaleState::Paused, SaleState::Closed] {
        let s = QueueStats { sale_state: Some(state), ..stats(500, 0.0) };
        assert!(alerts_of(&s, &seen(0.0)).is_empty(), "{state}");
    }
    for state in [SaleState::Opening, SaleState::Open] {
        let s = QueueStats { sale_state: Some(state), ..stats(500, 0.0) };
        assert_eq!(alerts_of(&s, &seen(0.0)), vec!["RATE_UNDER_50"], "{state}");
    }
    let young = RateSeen { longest_wait_ms: 5_999, recent_rate: 0.0 };
    assert!(alerts_of(&stats(500, 0.0), &young).is_empty(), "under 3 ticks of 2 s");
    let old = RateSeen { longest_wait_ms: 6_000, recent_rate: 0.0 };
    assert_eq!(alerts_of(&stats(500, 0.0), &old), vec!["RATE_UNDER_50"], "a pump that never came");
}

#[test]
fn a_queue_six_seconds_old_is_judged_on_its_six_seconds() {
    // Entered at 10.3 s, ticks of 2 s admitting 100 each at 12, 14 and 16 s; now 16.3 s.
    let snap = TargetSnapshot {
        oldest_entry_ms: Some(10_300),
        admissions: vec![(8, 100), (7, 100), (6, 100)],
        ..TargetSnapshot::default()
    };
    let r = rate_seen(&snap, 2000, 16_300);
    assert_eq!(r.longest_wait_ms, 6000);
    assert!((r.recent_rate - 50.0).abs() < 1e-9, "{}", r.recent_rate);
    assert!(alerts_of(&stats(500, 5.0), &r).is_empty());
}

#[test]
fn a_sale_resumed_six_seconds_ago_is_judged_from_its_resume() {
    // Waiting since 0 s, paused until 10.3 s, then 100 admitted per 2-s tick; now 16.3 s.
    let record = crate::domain::SaleRecord { resumed_at_ms: Some(10_300), ..Default::default() };
    let snap = TargetSnapshot {
        oldest_entry_ms: Some(0),
        admissions: vec![(8, 100), (7, 100), (6, 100)],
        sale: Some(crate::store::SaleView { record, now_ms: 16_300 }),
        ..TargetSnapshot::default()
    };
    let r = rate_seen(&snap, 2000, 16_300);
    assert_eq!(r.longest_wait_ms, 6000);
    assert!(alerts_of(&stats(500, 5.0), &r).is_empty(), "{}", r.recent_rate);
}

#[test]
fn without_a_terminal_the_marker_word_shows_and_no_escape_codes() {
    let report = Report {
        redis: RedisHealth {
            url: Some("redis://x".into()),
            cluster_nodes: None,
            location: "redis://x".into(),
            ok: true,
            latency_ms: 0.2,
        },
        flag: "on 100%".into(),
        flag_version: 1,
        tick_ms: 2000,
        instances: vec!["vq-a".into()],
        drift: Vec::new(),
        targets: vec![TargetRow {
            target: "LIMITED_DROP:42".into(),
            stats: stats(950, 0.0),
            flag: "on 100%".into(),
            lock_holder: Some("a".into()),
            capacity_percent: 95.0,
            alerts: alerts_of(&stats(950, 0.0), &seen(0.0)),
            batch_changes: Vec::new(),
            sources: vec!["configuration of vq-a".into()],
            trend: None,
        }],
    };
    let text = render(&report, false);
    assert!(text.contains("OVER_CAPACITY_90 RATE_UNDER_50"), "{text}");
    assert!(!text.contains('\x1b'), "{text}");
}

/// A busy sale day: six-figure queues, a pre-queued sale with its countdown, both alerts.
fn busy_report() -> Report {
    let row = |target: &str, waiting: u64, rate: f64, sale: bool| {
        let mut s = stats(waiting, rate);
        s.max_capacity = 100_000;
        s.admitted_count = 98_765;
        s.avg_wait_seconds = 312.4;
        s.p95_wait_seconds = 1480.2;
        s.evicted_count = 4_321;
        s.tokens_issued = 98_765;
        s.tokens_used = 95_432;
        s.direct_tokens_used = 120;
        if sale {
            s.sale_state = Some(SaleState::PreQueue);
            s.opens_at = Some(crate::domain::format_instant(now_epoch_ms() + 3_600_000));
            s.prequeued_count = Some(95_000);
        }
        TargetRow {
            target: target.into(),
            flag: "on 100%".into(),
            lock_holder: Some("vq-7f9c2d-1234".into()),
            capacity_percent: waiting as f64 * 100.0 / 100_000.0,
            alerts: alerts_of(&s, &seen(rate)),
            batch_changes: Vec::new(),
            sources: vec!["configuration of vq-a".into()],
            trend: None,
            stats: s,
        }
    };
    Report {
        redis: RedisHealth {
            url: Some("redis://redis.internal.example:6379".into()),
            cluster_nodes: None,
            location: "redis://redis.internal.example:6379".into(),
            ok: true,
            latency_ms: 1.2,
        },
        flag: "on 100%".into(),
        flag_version: 12,
        tick_ms: 2000,
        instances: vec!["vq-a".into()],
        drift: Vec::new(),
        targets: vec![row("LIMITED_DROP:42", 95_000, 12.5, true), row("TICKETING_EVENT:2026", 10_000, 50.0, false)],
    }
}

#[test]
fn the_table_fits_100_columns_and_wide_shows_every_column() {
    let report = busy_report();
    let wide = render_within(&report, false, None);
    assert!(wide.lines().any(|l| l.chars().count() > 100), "the full table is wider than 100:\n{wide}");
    assert!(wide.contains("lock holder") && wide.contains("vq-7f9c2d-1234"), "{wide}");
    {
        let columns = 100;
        let text = render_within(&report, false, Some(columns));
        for line in text.lines() {
            assert!(line.chars().count() <= usize::from(columns), "over {columns} columns:\n{text}");
        }
        for shown in [
            "LIMITED_DROP:42",
            "TICKETING_EVENT:2026",
            "95000 (95 %)",
            "98765",
            "12.5 (50.0)",
            "312/1480",
            "OVER_CAPACITY_90",
            "LIMITED_DROP:42 sale: pre-queue, 95000 pre-queued, opens in",
            "flag on 100%",
        ] {
            assert!(text.contains(shown), "{shown} missing at {columns} columns:\n{text}");
        }
    }
    // A terminal wide enough gets every column.
    assert_eq!(render_within(&report, false, Some(400)), wide);
}
