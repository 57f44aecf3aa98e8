//! Key names. Operators and tests read these with redis-cli; they are a contract.

use crate::domain::{QueueTarget, UserId};

pub const ACTIVE: &str = "queue:active";
/// SET of the targets declared at runtime (`vq target add`), `LIMITED_DROP:42`; outside any
/// target's slot, read on its own.
pub const TARGETS: &str = "queue:targets";
/// SET of the targets with a sale scheduled (`vq sale schedule`), `LIMITED_DROP:42`, so that
/// `vq sale show` and `vq stats` list them before anyone enters; outside any target's slot.
pub const SALES: &str = "queue:sales";
pub const FLAG: &str = "virtual-queue:flag";
pub const GLOBAL_BATCH_SIZE: &str = "queue:config:batch_size";
/// HASH instance -> "version:applied_at_ms:expires_at_ms:missing:state" (written by the
/// prelude's `ack_value`, read by its `ack_parse`, in `flag_ack.lua` and `flag_acks.lua`): the
/// instances' flag acknowledgements (one key, so no SCAN is needed, also on Redis Cluster).
pub const FLAG_ACKS: &str = "virtual-queue:acks";

pub fn of(target: QueueTarget, name: &str) -> String {
    format!("queue:{{{target}}}:{name}")
}
pub fn token(target: QueueTarget, user: &UserId) -> String {
    format!("queue:{{{target}}}:token:{user}")
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
    format!("queue:{{{target}}}:used:{user}")
}
/// HASH token -> purchases claimed with it, for `purchases_per_admission` > 1
/// (`token_claim.lua`).
pub fn token_uses(target: QueueTarget, user: &UserId) -> String {
    format!("queue:{{{target}}}:uses:{user}")
}
/// HASH user -> the targets they hold a place in (`queue.max_queues_per_user`) with the ms each
/// was counted, "TARGET=ms TARGET=ms": the users of one bucket, one generation
/// (`lua/user_hold.lua`); a bucket's generations share a slot.
pub fn user_holds(bucket: u32, generation: u64) -> String {
    format!("queue:holds:{{h{bucket}}}:{generation}")
}
pub fn admission_lock(target: QueueTarget) -> String {
    format!("queue:admission:{{{target}}}")
}
