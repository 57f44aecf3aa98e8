//! The Lua scripts (one per atomic operation, see `lua/`), how they are run, and the
//! helpers that read their replies.

use std::sync::LazyLock;

use redis::Script;

use super::conn::Conn;
use crate::store::StoreError;

pub(super) static ENTER: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/enter.lua")));
pub(super) static STATUS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/status.lua")));
pub(super) static ISSUE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/issue.lua")));
pub(super) static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/leave.lua")));
pub(super) static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/admit.lua")));
pub(super) static EVICT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/evict.lua")));
pub(super) static TOKEN_CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/token_claim.lua")));
pub(super) static TOKEN_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/token_release.lua")));
pub(super) static GATE_PACE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/gate_pace.lua")));
pub(super) static FLAG_SET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/flag_set.lua")));
pub(super) static FLAG_ACK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/flag_ack.lua")));
pub(super) static FLAG_ACKS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/flag_acks.lua")));
pub(super) static SALE_SCHEDULE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/sale_schedule.lua")));
pub(super) static SALE_CONTROL: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/sale_control.lua")));
pub(super) static SALE_PLACE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/sale_place.lua")));
pub(super) static SALE_READ: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/sale_read.lua")));
pub(super) static VIEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../../lua/view.lua")));

/// Runs an EVALSHA; on NOSCRIPT (Redis restarted, failover, a new cluster node) loads the
/// script and runs it again.
pub(super) async fn eval_hot<T: redis::FromRedisValue>(
    mut conn: Conn,
    script: &Script,
    cmd: &redis::Cmd,
) -> Result<T, StoreError> {
    match cmd.query_async(&mut conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(&mut conn).await?;
            Ok(cmd.query_async(&mut conn).await?)
        }
        other => Ok(other?),
    }
}

pub(super) fn reply_err(what: &'static str, reply: &[String]) -> StoreError {
    StoreError::Reply { what, detail: format!("{reply:?}") }
}

pub(super) fn num(what: &'static str, reply: &[String], i: usize) -> Result<u64, StoreError> {
    reply.get(i).and_then(|s| s.parse::<u64>().ok()).ok_or_else(|| reply_err(what, reply))
}
