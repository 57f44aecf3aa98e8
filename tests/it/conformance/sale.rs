//! The sale lifecycle on both stores: the pre-queue and the opening order, pause, close,
//! clear and the ledger, and a close before anyone entered.

use super::*;
use vq::domain::{Ms, Users};

/// The sale's schedule in ms from now.
fn sale_in(now: u64, opens_in: u64, prequeue_from: Option<i64>) -> vq::domain::SaleSchedule {
    vq::domain::SaleSchedule {
        opens_at_ms: now + opens_in,
        prequeue_from_ms: prequeue_from.map(|d| (now as i64 + d) as u64),
        closes_at_ms: None,
    }
}

/// Before the pre-queue: SCHEDULED and nothing recorded; in it: PRE_QUEUE once per user,
/// counted against the capacity; at the opening the HMAC order of the seed, then first come.
/// Users as shops name them: the opening orders the ids as sent.
fn shop_id(u: u64) -> UserId {
    let id = if u.is_multiple_of(2) {
        format!("buyer_{u}@shop.example")
    } else {
        format!("3f2a9c1e-7b4d-4c1e-9a8f-{u:012}")
    };
    id.parse().unwrap()
}

#[tokio::test]
async fn the_sale_pre_queue_and_its_opening_order_agree_on_both_stores() {
    use std::sync::Arc;
    use vq::store::ScheduleOutcome;
    with_both(async |s, time| {
        let later = sale_in(time.now_ms(), 60_000, Some(30_000));
        assert!(matches!(s.schedule_sale(t(), later, [3; 32]).await.unwrap(), ScheduleOutcome::Scheduled { .. }));
        assert!(matches!(s.enter(t(), shop_id(1), &"tok").await.unwrap(), EnterOutcome::Scheduled(_)));
        assert_eq!(s.status(t(), shop_id(1), &"tok").await.unwrap(), StatusOutcome::NotInQueue);

        let schedule = sale_in(time.now_ms(), 700, Some(-1000));
        let ScheduleOutcome::Scheduled { commitment } = s.schedule_sale(t(), schedule, [4; 32]).await.unwrap() else {
            panic!("not scheduled")
        };
        assert_eq!(commitment, vq::domain::seed_commitment(&[3; 32]), "the first seed is kept");
        for u in 1..=5 {
            assert!(matches!(s.enter(t(), shop_id(u), &"tok").await.unwrap(), EnterOutcome::PreQueue(_)), "{u}");
        }
        assert!(matches!(s.enter(t(), shop_id(1), &"tok").await.unwrap(), EnterOutcome::PreQueue(_)));
        assert!(matches!(s.status(t(), shop_id(2), &"tok").await.unwrap(), StatusOutcome::PreQueue(_)));
        assert_eq!(s.status(t(), shop_id(9), &"tok").await.unwrap(), StatusOutcome::NotInQueue);
        assert_eq!(s.enter(t(), shop_id(6), &"tok").await.unwrap(), EnterOutcome::Full, "capacity 5");
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!(snap.prequeued, 5);
        let view = snap.sale.expect("sale");
        assert_eq!(view.record.state_at(view.now_ms), vq::domain::SaleState::PreQueue);
        assert!(view.record.revealed_seed().is_none());

        time.pass(750).await;
        s.register_active(t()).await.unwrap();
        s.set_batch_size(None, Some(2)).await.unwrap();
        let settings = Arc::new(test_settings(None));
        let pump = vq::pump::Pump::new(s.clone(), settings, "c".into());
        time.next_tick(500).await;
        let ticks = pump.tick().await.unwrap();
        assert_eq!(ticks[0].as_ref().unwrap().admit.unwrap().admitted, 2, "the opening tick admits");
        let view = s.read_sale(t()).await.unwrap().expect("sale");
        assert_eq!(view.record.revealed_seed(), Some(vq::domain::hex(&[3; 32]).as_str()));
        assert_eq!(view.record.prequeued, Some(5));
        let users: Vec<UserId> = (1..=5).map(shop_id).collect();
        let order = vq::domain::opening_order(&[3; 32], &users);
        for (i, u) in order.iter().enumerate() {
            match s.status(t(), u.clone(), &"tok").await.unwrap() {
                StatusOutcome::Admitted(_) => assert!(i < 2, "{u:?} at {i}"),
                StatusOutcome::Waiting(w) => assert_eq!((w.seq, w.ahead), (i as u64 + 1, i as u64 - 2), "{u:?}"),
                other => panic!("{u:?}: {other:?}"),
            }
        }
        assert_eq!(seq(s.enter(t(), shop_id(7), &"tok").await.unwrap()), 6, "after the pre-queue");
        s.set_batch_size(None, None).await.unwrap();
    })
    .await;
}

/// Pause holds admission, resume releases it, close answers CLOSED to all but the admitted,
/// and the ledger's admissions add up to the admitted count.
#[tokio::test]
async fn pause_close_clear_and_the_ledger_agree_on_both_stores() {
    use vq::domain::{LedgerEntry, SaleControl, SaleSource};
    with_both(async |s, time| {
        let tick = time.tick_ms;
        for u in 1..=4 {
            s.enter(t(), UserId::from(u), &"tok").await.unwrap();
        }
        assert!(s.control_sale(t(), SaleControl::Pause).await.unwrap());
        assert!(!s.control_sale(t(), SaleControl::Pause).await.unwrap());
        match s.enter(t(), UserId::from(4), &"tok").await.unwrap() {
            EnterOutcome::Waiting(w) => assert!(w.paused),
            other => panic!("{other:?}"),
        }
        time.next_tick(tick).await;
        let a = s.admit(t(), Users(3), Ms(tick)).await.unwrap();
        assert_eq!((a.advanced, a.admitted), (false, 0), "paused");
        assert!(s.control_sale(t(), SaleControl::Resume).await.unwrap());
        let a = s.admit(t(), Users(3), Ms(tick)).await.unwrap();
        assert_eq!(a.admitted, 3);
        let close = SaleControl::Close { message: "Sold out".into(), source: SaleSource::Command };
        assert!(s.control_sale(t(), close).await.unwrap());
        match s.status(t(), UserId::from(4), &"tok").await.unwrap() {
            StatusOutcome::Closed(n) => assert_eq!(n.message.as_deref(), Some("Sold out")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(s.enter(t(), UserId::from(9), &"tok").await.unwrap(), EnterOutcome::Closed(_)));
        // A user the queue never saw (or forgot) is told the sale is closed, not to enter again.
        assert!(
            matches!(s.status(t(), UserId::from(99), &"tok").await.unwrap(), StatusOutcome::Closed(_)),
            "unknown user"
        );
        assert_eq!(s.status(t(), UserId::from(1), &"issued").await.unwrap(), StatusOutcome::Admitted("issued".into()));
        time.next_tick(tick).await;
        assert_eq!(s.admit(t(), Users(3), Ms(tick)).await.unwrap().admitted, 0, "closed");
        let ledger = s.sale_ledger(t()).await.unwrap();
        let kinds: Vec<&str> = ledger
            .iter()
            .map(|e| match e {
                LedgerEntry::Admission { .. } => "admission",
                LedgerEntry::Opening { .. } => "opening",
                LedgerEntry::Pause { .. } => "pause",
                LedgerEntry::Resume { .. } => "resume",
                LedgerEntry::Close { .. } => "close",
                LedgerEntry::Clear { .. } => "clear",
                LedgerEntry::Schedule { .. } => "schedule",
                LedgerEntry::Batch { .. } => "batch",
            })
            .collect();
        assert_eq!(kinds, ["close", "admission", "resume", "pause"]);
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!(vq::domain::ledger_admitted(&ledger), snap.admitted_total);
        assert!(s.control_sale(t(), SaleControl::Clear).await.unwrap());
        assert_eq!(seq(s.enter(t(), UserId::from(10), &"tok").await.unwrap()), 5, "cleared: always open");
    })
    .await;
}

/// A sale closed before anyone entered: an enter and a poll of a user the target never saw
/// are both told CLOSED, with the message, on both stores.
#[tokio::test]
async fn a_sale_closed_before_anyone_entered_answers_closed_to_strangers_on_both_stores() {
    use vq::domain::{SaleControl, SaleSource};
    use vq::store::ScheduleOutcome;
    with_both(async |s, time| {
        let schedule = sale_in(time.now_ms(), 60_000, Some(-1000));
        assert!(matches!(s.schedule_sale(t(), schedule, [5; 32]).await.unwrap(), ScheduleOutcome::Scheduled { .. }));
        let close = SaleControl::Close { message: "Cancelled".into(), source: SaleSource::Command };
        assert!(s.control_sale(t(), close).await.unwrap());
        match s.status(t(), UserId::from(42), &"tok").await.unwrap() {
            StatusOutcome::Closed(n) => assert_eq!(n.message.as_deref(), Some("Cancelled")),
            other => panic!("poll: {other:?}"),
        }
        match s.enter(t(), UserId::from(42), &"tok").await.unwrap() {
            EnterOutcome::Closed(n) => assert_eq!(n.message.as_deref(), Some("Cancelled")),
            other => panic!("enter: {other:?}"),
        }
        assert_eq!(s.snapshot(t()).await.unwrap().waiting, 0, "nobody recorded");
    })
    .await;
}

/// A pause is not a schedule (`prelude.lua`'s `sale_phase`: only an opening, a closing time or
/// a close make a sale phase): without one, a paused target still takes users in as without a
/// sale, holds admission while paused, and once resumed keeps a record that a clear removes.
#[tokio::test]
async fn a_pause_without_a_schedule_holds_admission_but_makes_no_sale_phase_on_both_stores() {
    use vq::domain::SaleControl;
    use vq::store::ClearOutcome;
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        assert!(s.control_sale(t(), SaleControl::Pause).await.unwrap());
        let waiting = |o: EnterOutcome| match o {
            EnterOutcome::Waiting(w) => w,
            o => panic!("no schedule: into the queue, got {o:?}"),
        };
        assert!(waiting(s.enter(t(), UserId::from(1), &"tok").await.unwrap()).paused);
        assert_eq!(s.clear_sale(t(), false).await.unwrap(), ClearOutcome::Cleared, "a pause alone is no pre-queue");
        assert!(s.control_sale(t(), SaleControl::Pause).await.unwrap());
        time.next_tick(tick_ms).await;
        assert!(!s.admit(t(), Users(5), Ms(tick_ms)).await.unwrap().advanced, "paused: nobody is admitted");
        assert!(s.sale_targets().await.unwrap().is_empty(), "never scheduled");
        assert!(s.control_sale(t(), SaleControl::Resume).await.unwrap());
        assert!(!waiting(s.enter(t(), UserId::from(2), &"tok").await.unwrap()).paused);
        let view = s.read_sale(t()).await.unwrap().expect("a resumed sale keeps its record");
        assert!(!view.record.paused && view.record.resumed_at_ms.is_some(), "{view:?}");
        assert_eq!(view.record.state_at(view.now_ms), vq::domain::SaleState::Open);
        time.next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), Users(5), Ms(tick_ms)).await.unwrap().admitted, 2);
        assert_eq!(s.clear_sale(t(), false).await.unwrap(), ClearOutcome::Cleared, "the record is cleared");
        assert!(s.read_sale(t()).await.unwrap().is_none());
        assert_eq!(s.clear_sale(t(), false).await.unwrap(), ClearOutcome::NoSale);
    })
    .await;
}
