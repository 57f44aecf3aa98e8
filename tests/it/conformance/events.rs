//! The event logs on both stores: a sale's changes, the pre-queue's opening, the admission
//! milestones and the outflow's batch changes land in the target's log once each and in
//! order, written by the step that made the change; the instances' log; the webhooks'
//! cursors and leases.

use std::sync::Arc;

use vq::domain::{EventId, EventKind, EventLog, SaleControl, SaleSource};
use vq::store::{BatchChange, OutflowState};

use super::*;

fn types(events: &[vq::domain::Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind.name()).collect()
}

async fn all_events(s: &AnyStore, log: EventLog) -> Vec<vq::domain::Event> {
    s.read_events(log, EventId::ZERO, 1000).await.unwrap()
}

#[tokio::test]
async fn a_sale_appends_each_change_and_milestone_once_in_order() {
    with_both_configured(
        |s| s.events.admitted_every = 2,
        async |s, time| {
            let now = time.now_ms();
            let schedule = vq::domain::SaleSchedule {
                opens_at_ms: now + 2000,
                prequeue_from_ms: Some(now - 1000),
                closes_at_ms: None,
            };
            s.schedule_sale(t(), schedule, [7; 32]).await.unwrap();
            for u in 1..=3 {
                assert!(matches!(s.enter(t(), UserId::from(u), &"tok").await.unwrap(), EnterOutcome::PreQueue(_)));
            }
            s.register_active(t()).await.unwrap();
            s.set_batch_size(None, Some(2)).await.unwrap();
            let pump = vq::pump::Pump::new(s.clone(), Arc::new(test_settings(None)), "c".into());
            // Two ticks in the pre-queue: its opening is told once.
            pump.tick().await.unwrap();
            time.pass(450).await; // the admission lock's 400 ms
            time.next_tick(500).await;
            pump.tick().await.unwrap();
            time.pass(1750).await;
            time.next_tick(500).await;
            let ticks = pump.tick().await.unwrap();
            assert_eq!(ticks[0].as_ref().unwrap().admit.unwrap().admitted, 2, "the opening tick admits");
            time.next_tick(500).await;
            let ticks = pump.tick().await.unwrap();
            assert_eq!(ticks[0].as_ref().unwrap().admit.unwrap().admitted, 1, "the last one");
            time.next_tick(500).await;
            pump.tick().await.unwrap();
            assert!(s.control_sale(t(), SaleControl::Pause).await.unwrap());
            assert!(!s.control_sale(t(), SaleControl::Pause).await.unwrap(), "no change, no event");
            assert!(s.control_sale(t(), SaleControl::Resume).await.unwrap());
            let sold_out = SaleControl::Close { message: "Sold out".into(), source: SaleSource::PurchaseApi };
            assert!(s.control_sale(t(), sold_out).await.unwrap());
            s.set_batch_size(None, None).await.unwrap();

            let events = all_events(&s, EventLog::Target(t())).await;
            assert_eq!(types(&events), [&crate::events::SALE_TO_RESUME[..], &["sale.sold_out"]].concat());
            assert!(events.windows(2).all(|w| w[0].id < w[1].id), "ids grow: {events:?}");
            assert_eq!(
                events[2].kind,
                EventKind::SaleOpened { prequeued: 3, seed_commitment: vq::domain::seed_commitment(&[7; 32]) }
            );
            assert_eq!(events[3].kind, EventKind::FirstAdmission { admitted: 2 });
            assert_eq!(events[4].kind, EventKind::AdmissionMilestone { admitted: 2 });
            assert_eq!(events[8].kind, EventKind::SoldOut { message: "Sold out".into() });
            // Read on from any event: exactly the ones after it.
            let rest = s.read_events(EventLog::Target(t()), events[5].id, 1000).await.unwrap();
            assert_eq!(rest, events[6..].to_vec());
            assert_eq!(s.read_events(EventLog::Target(t()), events[1].id, 2).await.unwrap(), events[2..4].to_vec());
            assert!(all_events(&s, EventLog::Instances).await.is_empty(), "targets' events stay in their logs");
        },
    )
    .await;
}

#[tokio::test]
async fn a_batch_change_of_the_outflow_is_an_event_and_a_kept_batch_is_not() {
    with_both(async |s, time| {
        let state = |batch: u64, reason: &str| OutflowState {
            batch,
            reason: reason.into(),
            decided_at_ms: time.now_ms(),
            no_show_bp: None,
            tokens_used: 0,
            tokens_expired: 0,
            purchases: 40,
            p95_ms: Some(900),
            error_bp: 2500,
        };
        s.set_outflow(t(), &state(10, "healthy"), None).await.unwrap();
        let change = BatchChange { from: Some(10), instance: "a".into() };
        s.set_outflow(t(), &state(5, "errors 25% > 10%"), Some(change)).await.unwrap();
        let events = all_events(&s, EventLog::Target(t())).await;
        assert_eq!(
            events.iter().map(|e| e.kind.clone()).collect::<Vec<_>>(),
            [EventKind::BatchChanged { from: Some(10), to: 5, reason: "errors 25% > 10%".into() }]
        );
    })
    .await;
}

#[tokio::test]
async fn the_instances_log_cursors_and_leases_agree_on_both_stores() {
    with_both(async |s, time| {
        let degraded = |count| EventKind::Degraded { instance: "i-1".into(), answer: "failed_open".into(), count };
        s.append_instance_event(time.now_ms(), &degraded(3)).await.unwrap();
        s.append_instance_event(time.now_ms(), &degraded(1)).await.unwrap();
        let drift = EventKind::ClockDrift { instance: "i-1".into(), offset_ms: -1200, off: true };
        s.append_instance_event(time.now_ms(), &drift).await.unwrap();
        let events = all_events(&s, EventLog::Instances).await;
        assert_eq!(events.iter().map(|e| e.kind.clone()).collect::<Vec<_>>(), [degraded(3), degraded(1), drift]);
        assert_eq!(events[0].wire_id(), format!("vq/{}", events[0].id));

        assert_eq!(s.event_cursor("shop", EventLog::Instances).await.unwrap(), None);
        s.save_event_cursor("shop", EventLog::Instances, events[0].id).await.unwrap();
        assert_eq!(s.event_cursor("shop", EventLog::Instances).await.unwrap(), Some(events[0].id));
        assert_eq!(s.event_cursor("crm", EventLog::Instances).await.unwrap(), None, "a cursor per webhook");
        assert_eq!(s.event_cursor("shop", EventLog::Target(t())).await.unwrap(), None, "and per log");

        assert!(s.lease_events("shop", "a", 300).await.unwrap());
        assert!(!s.lease_events("shop", "b", 300).await.unwrap(), "held by a");
        assert!(s.lease_events("crm", "b", 300).await.unwrap(), "a lease per webhook");
        time.pass(200).await;
        assert!(s.lease_events("shop", "a", 300).await.unwrap(), "the holder renews");
        time.pass(200).await;
        assert!(!s.lease_events("shop", "b", 300).await.unwrap(), "renewed: still a's");
        time.pass(150).await;
        assert!(s.lease_events("shop", "b", 300).await.unwrap(), "expired: b takes it");
    })
    .await;
}
