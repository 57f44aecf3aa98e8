//! What operators and instances write besides the queue: flag acknowledgements, batch sizes,
//! the instances' reports.

use vq::domain::FlagChange;
use vq::store::FlagAck;

use super::*;
use vq::domain::{Ms, Users};

#[tokio::test]
async fn flag_acknowledgements_are_listed_by_instance_and_stay_listed_silent_once_expired() {
    with_both(async |s, time| {
        let ack = |instance: &str, version, ms: u64| FlagAck {
            instance: instance.into(),
            version,
            applied_at_ms: ms,
            kept_missing: instance == "b",
            state: "on 40%: a:b".into(),
            silent_ms: None,
        };
        assert!(s.flag_acks().await.unwrap().is_empty());
        // (Redis expires the whole hash with the last acknowledgement written, so the longer
        // lived one goes last; instances all write with one lifetime.)
        s.ack_flag(ack("a", 3, 1), 300).await.unwrap();
        s.ack_flag(ack("b", 41, 2), 60_000).await.unwrap();
        let acks = s.flag_acks().await.unwrap();
        assert_eq!(acks.len(), 2);
        assert_eq!(acks[0], FlagAck { state: "on 40%  a b".into(), ..ack("a", 3, 1) }, "':' cannot be stored");
        assert_eq!(acks[1], FlagAck { state: "on 40%  a b".into(), ..ack("b", 41, 2) });
        // Expired, a's acknowledgement stays listed, silent (FLAG_ACK_KEEP_MS), until withdrawn.
        let silent = async || s.flag_acks().await.unwrap()[0].silent_ms.is_some();
        assert!(time.eventually(silent).await, "a's never expired");
        let acks = s.flag_acks().await.unwrap();
        assert_eq!((acks.len(), acks[0].version, acks[1].silent_ms), (2, 3, None), "{acks:?}");
        s.withdraw_flag_ack("a").await.unwrap();
        assert_eq!(s.flag_acks().await.unwrap().len(), 1);
        assert_eq!(s.flag_acks().await.unwrap()[0].instance, "b");
        s.ack_flag(ack("b", 42, 3), 60_000).await.unwrap();
        assert_eq!(s.flag_acks().await.unwrap()[0].version, 42, "one acknowledgement per instance");
        assert_eq!(s.change_flag(FlagChange::On { percent: 100 }).await.unwrap(), 43, "above every ack");
    })
    .await;
}

#[tokio::test]
async fn batch_sizes_are_set_and_cleared_globally_and_per_target() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        assert_eq!(s.global_batch_size().await.unwrap(), None);
        s.set_batch_size(None, Some(7)).await.unwrap();
        assert_eq!(s.global_batch_size().await.unwrap(), Some(7));
        s.set_batch_size(None, None).await.unwrap();
        assert_eq!(s.global_batch_size().await.unwrap(), None);
        s.set_batch_size(Some(t()), Some(2)).await.unwrap();
        match s.enter(t(), UserId::from(1), &"tok").await.unwrap() {
            EnterOutcome::Waiting(w) => assert_eq!(w.batch_override, Some(2)),
            o => panic!("{o:?}"),
        }
        assert_eq!(s.snapshot(t()).await.unwrap().batch_override, Some(2));
        s.set_batch_size(Some(t()), None).await.unwrap();
        match s.status(t(), UserId::from(1), &"tok").await.unwrap() {
            StatusOutcome::Waiting(w) => assert_eq!(w.batch_override, None),
            o => panic!("{o:?}"),
        }
        time.next_tick(tick_ms).await;
        let a = s.admit(t(), Users(4), Ms(tick_ms)).await.unwrap();
        assert_eq!((a.batch, a.admitted), (4, 1));
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!((snap.batch_override, snap.admissions.first().copied()), (None, Some((a.tick, 1))));
    })
    .await;
}

/// Every operator change is one write that bumps the version; the rollback (`Off`) clears every
/// target override in the same step (`clear_overrides`), so no target stays queued.
#[tokio::test]
async fn flag_changes_bump_the_version_and_the_rollback_clears_every_override() {
    use vq::domain::TargetOverride;
    with_both(async |s, _| {
        s.ping().await.expect("the store answers");
        assert_eq!(s.read_stored_flag().await.unwrap(), None, "never written");
        let other: QueueTarget = "ticketing-event:7".parse().unwrap();
        let v1 = s.change_flag(FlagChange::On { percent: 30 }).await.unwrap();
        let v2 = s.change_flag(FlagChange::Target(t(), TargetOverride::Off)).await.unwrap();
        let v3 = s.change_flag(FlagChange::Target(other, TargetOverride::On { percent: 100 })).await.unwrap();
        let v4 = s.change_flag(FlagChange::Pow(Some(12))).await.unwrap();
        assert_eq!((v2, v3, v4), (v1 + 1, v1 + 2, v1 + 3));
        let f = s.read_stored_flag().await.unwrap().expect("written");
        assert_eq!((f.enabled, f.percent, f.overrides.len(), f.pow_bits, f.version), (true, 30, 2, Some(12), v4));
        s.change_flag(FlagChange::ClearTarget(other)).await.unwrap();
        assert_eq!(s.read_flag().await.unwrap().overrides.len(), 1);
        let off = s.change_flag(FlagChange::Off).await.unwrap();
        let f = s.read_flag().await.unwrap();
        assert_eq!((f.enabled, f.version), (false, off));
        assert!(f.overrides.is_empty(), "the rollback leaves no target queued: {f:?}");
        assert_eq!(f.pow_bits, Some(12), "only overrides go with the rollback");
        s.change_flag(FlagChange::Pow(None)).await.unwrap();
        assert_eq!(s.read_flag().await.unwrap().pow_bits, None);
        s.ping().await.expect("the store still answers");
    })
    .await;
}

/// Runtime declarations are bounded by the room given; deactivating a target takes it out of
/// the set the pump walks.
#[tokio::test]
async fn targets_are_declared_within_the_room_and_deactivated_on_request() {
    use vq::store::DeclareOutcome;
    with_both(async |s, _| {
        let other: QueueTarget = "ticketing-event:7".parse().unwrap();
        assert!(s.declared_targets().await.unwrap().is_empty());
        assert_eq!(s.declare_target(t(), 1).await.unwrap(), DeclareOutcome::Added);
        assert_eq!(s.declare_target(t(), 1).await.unwrap(), DeclareOutcome::AlreadyDeclared);
        assert_eq!(s.declare_target(other, 1).await.unwrap(), DeclareOutcome::Full { room: 1 });
        assert_eq!(s.declared_targets().await.unwrap(), vec![t()]);
        assert!(s.undeclare_target(t()).await.unwrap());
        assert!(!s.undeclare_target(t()).await.unwrap(), "declared no more");
        assert!(s.declared_targets().await.unwrap().is_empty());
        s.register_active(t()).await.unwrap();
        s.register_active(other).await.unwrap();
        s.deactivate(t()).await.unwrap();
        assert_eq!(s.active_targets().await.unwrap(), vec![other]);
    })
    .await;
}

#[tokio::test]
async fn instance_reports_round_trip_expire_and_are_withdrawn() {
    use vq::domain::{DeclaredTargets, InstanceReport, QueueTargetType};
    with_both(async |s, time| {
        let report = |instance: &str, tick: &str| InstanceReport {
            instance: instance.to_owned(),
            types: vec![QueueTargetType::parse_any("limited-drop").unwrap()],
            declared: DeclaredTargets { listed: [t()].into(), ranges: vec!["limited-drop:1000-1999".parse().unwrap()] },
            settings: [("queue.tick_ms".to_owned(), tick.to_owned()), ("token.key_ids".to_owned(), "ab12".to_owned())]
                .into(),
        };
        assert!(s.fleet().await.unwrap().is_empty());
        s.report_instance(&report("b", "2000"), 60_000).await.unwrap();
        s.report_instance(&report("a", "2000"), 300).await.unwrap();
        assert_eq!(s.fleet().await.unwrap(), vec![report("a", "2000"), report("b", "2000")], "by instance");
        let gone = async || s.fleet().await.unwrap().len() == 1;
        assert!(time.eventually(gone).await, "a's report never expired");
        assert_eq!(s.fleet().await.unwrap()[0].instance, "b");
        s.report_instance(&report("b", "1500"), 60_000).await.unwrap();
        assert_eq!(s.fleet().await.unwrap(), vec![report("b", "1500")], "one report per instance");
        s.withdraw_instance("b").await.unwrap();
        assert!(s.fleet().await.unwrap().is_empty());
    })
    .await;
}
