//! Key names. Operators and tests read these with redis-cli; they are a contract.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use crate::domain::{EventLog, QueueTarget, UserId, shard_tag};

pub const ACTIVE: &str = "queue:active";
/// SET of the targets declared at runtime (`vq target add`), `LIMITED_DROP:42`; outside any
/// target's slot, read on its own.
pub const TARGETS: &str = "queue:targets";
/// SET of the targets with a sale scheduled (`vq sale schedule`), `LIMITED_DROP:42`, so that
/// `vq sale show` and `vq stats` list them before anyone enters; outside any target's slot.
pub const SALES: &str = "queue:sales";
pub const FLAG: &str = "virtual-queue:flag";
pub const GLOBAL_BATCH_SIZE: &str = "queue:config:batch_size";
/// STREAM the instances' event log (`store::EventOps`); each target's is `queue:{T}:events`.
pub const INSTANCE_EVENTS: &str = "queue:events";
/// SET of the targets with an event log (`LIMITED_DROP:42`), read by the webhooks' delivery
/// and `vq events`; outside any target's slot.
pub const EVENT_LOGS: &str = "queue:events:logs";
/// HASH "<subscriber>|<log>" -> the last event id delivered to that webhook from that log.
pub const EVENT_CURSORS: &str = "queue:events:delivered";
/// HASH instance -> "version:applied_at_ms:expires_at_ms:missing:state" (written by the
/// prelude's `ack_value`, read by its `ack_parse`, in `flag_ack.lua` and `flag_acks.lua`): the
/// instances' flag acknowledgements (one key, so no SCAN is needed, also on Redis Cluster).
pub const FLAG_ACKS: &str = "virtual-queue:acks";
/// HASH instance -> "expires_at_ms|{json}": each serving instance's report of itself (its
/// configured types and declarations, the settings that must agree), `store/redis/fleet.rs`.
pub const FLEET: &str = "virtual-queue:fleet";

/// The hash tag of `target`'s keys: `TYPE:id` for the whole target and its shard 0, and for
/// shard s ≥ 1 of a sharded target `TYPE:id#s.k` (`domain::shard_tag`: its slot in a range of
/// its own); a lane's parts the same with `TYPE:id~lane` in place of `TYPE:id`. Computed once
/// per part and kept.
pub fn tag(target: QueueTarget) -> Arc<str> {
    static TAGS: LazyLock<Mutex<HashMap<QueueTarget, Arc<str>>>> = LazyLock::new(Mutex::default);
    let mut tags = TAGS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(t) = tags.get(&target) {
        return t.clone();
    }
    let tag: Arc<str> = shard_tag(&target.lane_tag(), target.shard.index, target.shard.count).into();
    // Bounded: shards of the targets this instance served; a runaway set is dropped whole.
    if tags.len() >= 100_000 {
        tags.clear();
    }
    tags.insert(target, tag.clone());
    tag
}

pub fn of(target: QueueTarget, name: &str) -> String {
    format!("queue:{{{}}}:{name}", tag(target))
}
pub fn token(target: QueueTarget, user: &UserId) -> String {
    format!("queue:{{{}}}:token:{user}", tag(target))
}
/// What the token key (`token`) holds once a purchase claimed its token: this prefix and the
/// token (`token_claim.lua`, through the prelude's `used_mark`, which tests check against it).
pub const USED_MARK: &str = "used:";

/// The token of a token key's value marked used, `None` when it is not marked.
pub fn used_token(value: &str) -> Option<&str> {
    value.strip_prefix(USED_MARK)
}

/// ZSET token -> expiry ms of every token the user bought with (`token_claim.lua`).
pub fn used_tokens(target: QueueTarget, user: &UserId) -> String {
    format!("queue:{{{}}}:used:{user}", tag(target))
}
/// HASH token -> purchases claimed with it, for `purchases_per_admission` > 1
/// (`token_claim.lua`).
pub fn token_uses(target: QueueTarget, user: &UserId) -> String {
    format!("queue:{{{}}}:uses:{user}", tag(target))
}
/// HASH user -> the targets they hold a place in (`queue.max_queues_per_user`) with the ms each
/// was counted, "TARGET=ms TARGET=ms": the users of one bucket, one generation
/// (`lua/user_hold.lua`); a bucket's generations share a slot.
pub fn user_holds(bucket: u32, generation: u64) -> String {
    format!("queue:holds:{{h{bucket}}}:{generation}")
}
/// STRING the instance delivering the events to one webhook (`lua/events_lease.lua`).
pub fn events_lease(name: &str) -> String {
    format!("queue:events:lease:{name}")
}
/// The STREAM of an event log.
pub fn event_log(log: EventLog) -> String {
    match log {
        EventLog::Instances => INSTANCE_EVENTS.to_owned(),
        EventLog::Target(t) => of(t, "events"),
    }
}
pub fn admission_lock(target: QueueTarget) -> String {
    format!("queue:admission:{{{}}}", tag(target))
}
