//! What operators and instances write besides the queue: flag acknowledgements, batch sizes.

use vq::store::FlagAck;

use super::*;

#[tokio::test]
async fn flag_acknowledgements_are_listed_by_instance_and_stay_listed_silent_once_expired() {
    with_both(async |s, _| {
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
        assert!(eventually(silent).await, "a's never expired");
        let acks = s.flag_acks().await.unwrap();
        assert_eq!((acks.len(), acks[0].version, acks[1].silent_ms), (2, 3, None), "{acks:?}");
        s.withdraw_flag_ack("a").await.unwrap();
        assert_eq!(s.flag_acks().await.unwrap().len(), 1);
        assert_eq!(s.flag_acks().await.unwrap()[0].instance, "b");
        s.ack_flag(ack("b", 42, 3), 60_000).await.unwrap();
        assert_eq!(s.flag_acks().await.unwrap()[0].version, 42, "one acknowledgement per instance");
        assert_eq!(s.write_flag(vec![("enabled".into(), "1".into())], vec![]).await.unwrap(), 43, "above every ack");
    })
    .await;
}

#[tokio::test]
async fn batch_sizes_are_set_and_cleared_globally_and_per_target() {
    with_both(async |s, tick_ms| {
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
        next_tick(tick_ms).await;
        let a = s.admit(t(), 4, tick_ms).await.unwrap();
        assert_eq!((a.batch, a.admitted), (4, 1));
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!((snap.batch_override, snap.admissions.first().copied()), (None, Some((a.tick, 1))));
    })
    .await;
}
