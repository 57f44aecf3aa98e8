//! The Lua scripts (one per atomic operation, see `lua/`), how they are run, and the
//! helpers that read their replies.
//!
//! Written once on each side and checked against each other by the tests below: the reply
//! codes ([`Code`], the `local` constants of `lua/prelude.lua`), and each script's KEYS order
//! (the `*_KEYS` lists here, the `-- KEYS[i]` lines of its header). Every script is sent with
//! `lua/prelude.lua` in front, where the rules they share live, Redis' clock (`now_ms`) first.

use std::sync::LazyLock;

use redis::{Script, ScriptInvocation};

use super::conn::Conn;
use super::keys;
use crate::domain::QueueTarget;
use crate::store::StoreError;

/// The prelude and a script, as one text.
macro_rules! with_prelude {
    ($file:literal) => {
        concat!(include_str!("../../../lua/prelude.lua"), "\n", include_str!(concat!("../../../lua/", $file)))
    };
}

pub(super) static ENTER: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("enter.lua")));
pub(super) static STATUS: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("status.lua")));
pub(super) static ISSUE: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("issue.lua")));

/// `domain::stats::WAIT_BUCKETS` as `admit.lua` takes it (ARGV[11]): "below:width ...".
pub(super) static WAIT_BUCKET_EDGES: LazyLock<String> = LazyLock::new(|| {
    crate::domain::WAIT_BUCKETS.iter().map(|(below, width)| format!("{below}:{width}")).collect::<Vec<_>>().join(" ")
});

/// The target keys of each script, in KEYS order (`keys::of(target, name)`); per-user keys
/// and the sale's keys follow where the script's header says.
pub(super) const ENTER_KEYS: &[&str] =
    &["waiting", "heartbeat", "seq", "admitted_count", "batch_size", "entry_times", "departed", "record"];
pub(super) const STATUS_KEYS: &[&str] = &["waiting", "heartbeat", "admitted_count", "batch_size", "departed"];
pub(super) const ISSUE_KEYS: &[&str] = &["waiting", "heartbeat", "admitted_count", "waits", "record", "unused"];
pub(super) const TOKENS_EXPIRE_KEYS: &[&str] = &["unused", "waits"];
pub(super) const ACTIVE_COUNT_KEYS: &[&str] = &["waiting", "admitted_count", "unused"];
pub(super) const OUTFLOW_SET_KEYS: &[&str] = &["outflow", "ledger", "events"];
/// After the per-user keys of `enter.lua` and `status.lua`.
pub(super) const SALE_KEYS: &[&str] = &["sale", "prequeue", "opening"];
pub(super) const ADMIT_KEYS: &[&str] = &[
    "waiting",
    "admitted_count",
    "last_tick",
    "batch_size",
    "admissions",
    "entry_times",
    "waits",
    "heartbeat",
    "seq",
    "evicted",
    "departed",
    "sale",
    "prequeue",
    "opening",
    "ledger",
    "record",
    "events",
];
pub(super) const EVICT_KEYS: &[&str] = &["waiting", "heartbeat", "evicted", "departed", "prequeue", "record"];
pub(super) const LEAVE_KEYS: &[&str] = &["waiting", "heartbeat", "departed", "prequeue", "record"];
pub(super) const VIEW_KEYS: &[&str] = &["waiting", "heartbeat", "admitted_count", "batch_size", "departed", "sale"];
pub(super) const GATE_PACE_KEYS: &[&str] = &["forwarded", "batch_size"];
pub(super) const SALE_SCHEDULE_KEYS: &[&str] = &["sale", "ledger", "record", "events"];
pub(super) const SALE_CONTROL_KEYS: &[&str] = &["sale", "ledger", "prequeue", "opening", "record", "events", "bought"];
pub(super) const SALE_READ_KEYS: &[&str] = &["sale", "prequeue", "opening"];
pub(super) const SALE_PLACE_KEYS: &[&str] =
    &["waiting", "heartbeat", "departed", "entry_times", "sale", "opening", "ledger", "record", "events"];

/// An invocation of `script` with `target`'s keys `names`, in that order.
pub(super) fn on_target<'a>(script: &'a Script, target: QueueTarget, names: &[&str]) -> ScriptInvocation<'a> {
    let mut inv = script.prepare_invoke();
    for name in names {
        inv.key(keys::of(target, name));
    }
    inv
}

/// The per-user reply codes of `enter.lua`, `status.lua` and `issue.lua`: the number, and the
/// name the prelude gives it (SCREAMING_SNAKE_CASE of the variant).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::FromRepr, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
#[repr(u8)]
pub(super) enum Code {
    Waiting = 1,
    Admitted = 2,
    Full = 3,
    NotInQueue = 4,
    Issue = 5,
    PreQueue = 6,
    Scheduled = 7,
    Closed = 8,
}

impl Code {
    pub(super) fn of(n: u64) -> Option<Code> {
        u8::try_from(n).ok().and_then(Code::from_repr)
    }
}
pub(super) static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("leave.lua")));
pub(super) static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("admit.lua")));
pub(super) static EVICT: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("evict.lua")));
pub(super) static TOKEN_CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("token_claim.lua")));
pub(super) static TOKEN_RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("token_release.lua")));
pub(super) static GATE_PACE: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("gate_pace.lua")));
pub(super) static FLAG_SET: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("flag_set.lua")));
pub(super) static FLAG_ACK: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("flag_ack.lua")));
pub(super) static FLAG_ACKS: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("flag_acks.lua")));
pub(super) static SALE_SCHEDULE: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("sale_schedule.lua")));
pub(super) static SALE_CONTROL: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("sale_control.lua")));
pub(super) static SALE_PLACE: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("sale_place.lua")));
pub(super) static SALE_READ: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("sale_read.lua")));
pub(super) static TOKENS_EXPIRE: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("tokens_expire.lua")));
pub(super) static ACTIVE_COUNT: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("active_count.lua")));
pub(super) static OUTFLOW_SET: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("outflow_set.lua")));
pub(super) static OUTFLOW_OBSERVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(with_prelude!("outflow_observe.lua")));
pub(super) static OUTFLOW_CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("outflow_claim.lua")));
pub(super) static USER_HOLD: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("user_hold.lua")));
pub(super) static VIEW: LazyLock<Script> = LazyLock::new(|| Script::new(with_prelude!("view.lua")));

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

#[cfg(test)]
mod tests {
    use super::*;

    const PRELUDE: &str = include_str!("../../../lua/prelude.lua");

    /// `local NAME = n` lines of the prelude.
    fn lua_constants() -> Vec<(String, u64)> {
        PRELUDE
            .lines()
            .filter_map(|l| l.strip_prefix("local ")?.split_once(" = "))
            .filter_map(|(name, v)| Some((name.to_owned(), v.trim().parse().ok()?)))
            .collect()
    }

    #[test]
    fn used_mark_is_the_preludes() {
        assert!(PRELUDE.contains(&format!("local USED_MARK = '{}'", keys::USED_MARK)));
        assert_eq!(keys::used_token("used:abc"), Some("abc"));
        assert_eq!(keys::used_token("abc"), None);
    }

    #[test]
    fn wait_bucket_edges_are_sent_as_the_prelude_reads_them() {
        assert_eq!(WAIT_BUCKET_EDGES.as_str(), "120:1 600:10 3600:60");
    }

    #[test]
    fn reply_codes_are_the_preludes() {
        let lua = lua_constants();
        let name = |c: Code| -> &'static str { c.into() };
        use strum::IntoEnumIterator;
        for c in Code::iter() {
            assert!(lua.contains(&(name(c).to_owned(), c as u64)), "{c:?} is not `local {} = {}`", name(c), c as u64);
            assert_eq!(Code::of(c as u64), Some(c));
        }
        let codes = lua.iter().filter(|(n, _)| !n.starts_with("P_") && n != "NO_SALE").count();
        assert_eq!(codes, Code::iter().count(), "a code in the prelude that Rust does not know: {lua:?}");
        assert_eq!(Code::of(0), None);
        assert_eq!(Code::of(9), None);
    }

    /// The target key names of `-- KEYS[<digits>] queue:{T}:<name>` lines, in order, and of
    /// the lines after the per-user keys (`-- KEYS[<k>+n] …`).
    fn header_keys(script: &str) -> (Vec<String>, Vec<String>) {
        let (mut fixed, mut after) = (Vec::new(), Vec::new());
        for line in script.lines() {
            let Some(rest) = line.strip_prefix("-- KEYS[") else { continue };
            let Some((index, key)) = rest.split_once(']') else { continue };
            let Some(name) = key.split_whitespace().next().and_then(|k| k.strip_prefix("queue:{T}:")) else {
                continue;
            };
            if name.contains('{') {
                continue; // a per-user key
            }
            if index.chars().all(|c| c.is_ascii_digit()) {
                fixed.push(name.to_owned());
            } else if index.ends_with("+n") {
                after.push(name.to_owned());
            }
        }
        (fixed, after)
    }

    #[test]
    fn key_lists_are_the_script_headers() {
        macro_rules! lua {
            ($f:literal) => {
                ($f, include_str!(concat!("../../../lua/", $f)))
            };
        }
        type Case = ((&'static str, &'static str), &'static [&'static str], &'static [&'static str]);
        let cases: [Case; 15] = [
            (lua!("active_count.lua"), ACTIVE_COUNT_KEYS, &[]),
            (lua!("outflow_set.lua"), OUTFLOW_SET_KEYS, &[]),
            (lua!("tokens_expire.lua"), TOKENS_EXPIRE_KEYS, &[]),
            (lua!("enter.lua"), ENTER_KEYS, SALE_KEYS),
            (lua!("status.lua"), STATUS_KEYS, SALE_KEYS),
            (lua!("issue.lua"), ISSUE_KEYS, &[]),
            (lua!("admit.lua"), ADMIT_KEYS, &[]),
            (lua!("evict.lua"), EVICT_KEYS, &[]),
            (lua!("leave.lua"), LEAVE_KEYS, &[]),
            (lua!("view.lua"), VIEW_KEYS, &[]),
            (lua!("gate_pace.lua"), GATE_PACE_KEYS, &[]),
            (lua!("sale_schedule.lua"), SALE_SCHEDULE_KEYS, &[]),
            (lua!("sale_control.lua"), SALE_CONTROL_KEYS, &[]),
            (lua!("sale_read.lua"), SALE_READ_KEYS, &[]),
            (lua!("sale_place.lua"), SALE_PLACE_KEYS, &[]),
        ];
        for ((file, text), keys, after) in cases {
            let (fixed, tail) = header_keys(text);
            assert_eq!(fixed, keys, "{file}: KEYS before the per-user keys");
            assert_eq!(tail, after, "{file}: KEYS after the per-user keys");
        }
    }
}
