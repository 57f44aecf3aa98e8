//! Each script's KEYS and ARGV, declared once. KEYS: the target key names in KEYS order
//! (`ENTER_KEYS`, …, built by `scripts::on_target`) or, for the scripts with per-user,
//! per-interval or global keys, the function that builds them (`token_claim_keys`, …); tests
//! check both against each header's `-- KEYS[i]` lines. ARGV: a struct per script whose fields are its arguments in
//! ARGV order, named as the script's header names them (`-- ARGV[i] <name>: …`). A call sets
//! the arguments by name (`EnterArgs { capacity: …, key_ttl_s: …, … }`), so a forgotten one
//! does not compile and two swapped ones are two wrong names in plain sight; the order sent is
//! the declaration's, and the tests below check every declaration against its script's
//! header. Arguments that are a number of `store/rules.rs` (or `domain::WAIT_BUCKETS`) are
//! filled in by the declaration itself (`name = value`): no caller writes them.
//!
//! A script's variadic tail (users, pairs, …) follows the declared arguments; its names are
//! declared too (`TAIL`) and checked, and the caller pushes it.
//!
//! Adding an argument to a script: its header line (`-- ARGV[i] name: what`) and the field
//! here, at the same place; the compiler then names every call to complete.

use redis::{Cmd, ToRedisArgs};

use super::keys;
use super::scripts::{Invocation, WAIT_BUCKET_EDGES};
use super::slices::SWEEP_SEQS;
use crate::domain::{QueueTarget, UserId};
use crate::store::rules::{ADMISSIONS_KEPT, FLAG_ACK_KEEP_MS, LEDGER_MAX_ROWS, PACE_GUARD_MS, TTL_REFRESH_EVERY};

pub use super::codec::SALE_FIELDS;

/// The target keys of each script, in KEYS order (`keys::of(target, name)`); per-user keys
/// and the sale's keys follow where the script's header says.
pub const ENTER_KEYS: &[&str] =
    &["waiting", "heartbeat", "seq", "admitted_count", "batch_size", "entry_times", "departed", "record", "beats"];
pub const STATUS_KEYS: &[&str] =
    &["waiting", "heartbeat", "admitted_count", "batch_size", "departed", "beats", "waits", "record", "unused"];
pub const ISSUE_KEYS: &[&str] = &["waiting", "heartbeat", "admitted_count", "waits", "record", "unused"];
pub const TOKENS_EXPIRE_KEYS: &[&str] = &["unused", "waits"];
pub const ACTIVE_COUNT_KEYS: &[&str] = &["waiting", "admitted_count", "unused"];
pub const OUTFLOW_SET_KEYS: &[&str] = &["outflow", "ledger", "events"];
pub const ADMIT_MILESTONES_KEYS: &[&str] = &["milestones", "events"];
/// After the per-user keys of `enter.lua` and `status.lua`.
pub const SALE_KEYS: &[&str] = &["sale", "prequeue", "opening"];
pub const ADMIT_KEYS: &[&str] = &[
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
pub const EVICT_KEYS: &[&str] =
    &["waiting", "heartbeat", "evicted", "departed", "beats", "sweep", "seq", "prequeue", "record"];
pub const LANE_JOIN_KEYS: &[&str] = &["lane_codes", "lane_of"];
pub const LEAVE_KEYS: &[&str] = &["waiting", "heartbeat", "departed", "prequeue", "record"];
pub const VIEW_KEYS: &[&str] = &["waiting", "beats", "admitted_count", "batch_size", "departed", "sale"];
pub const GATE_PACE_KEYS: &[&str] = &["forwarded", "batch_size"];
pub const SALE_SCHEDULE_KEYS: &[&str] = &["sale", "ledger", "record", "events"];
pub const SALE_CONTROL_KEYS: &[&str] = &["sale", "ledger", "prequeue", "opening", "record", "events", "bought"];
pub const SALE_READ_KEYS: &[&str] = &["sale", "prequeue", "opening"];
pub const SALE_PLACE_KEYS: &[&str] =
    &["waiting", "heartbeat", "departed", "entry_times", "sale", "opening", "ledger", "record", "events", "beats"];

/// The KEYS of the scripts whose keys are not only a target's named keys, in KEYS order, as
/// their calls build them (checked against each header's `-- KEYS[i] <pattern>` lines).
/// `events_lease.lua`: the webhook's lease.
pub(super) fn events_lease_keys(name: &str) -> [String; 1] {
    [keys::events_lease(name)]
}

/// `flag_ack.lua` and `flag_acks.lua`: the acknowledgements.
pub(super) const FLAG_ACK_KEYS: [&str; 1] = [keys::FLAG_ACKS];

/// `flag_set.lua`: the flag.
pub(super) const FLAG_SET_KEYS: [&str; 1] = [keys::FLAG];

/// `outflow_claim.lua`: the decision, the pin, interval `interval`'s observations, the counters.
pub(super) fn outflow_claim_keys(target: QueueTarget, interval: u64) -> [String; 4] {
    [
        keys::of(target, "outflow"),
        keys::of(target, "batch_size"),
        keys::of(target, &format!("outflow:obs:{interval}")),
        keys::of(target, "waits"),
    ]
}

/// `outflow_observe.lua`: interval `interval`'s observations and its buyers.
pub(super) fn outflow_observe_keys(target: QueueTarget, interval: u64) -> [String; 2] {
    [keys::of(target, &format!("outflow:obs:{interval}")), keys::of(target, &format!("outflow:buyers:{interval}"))]
}

/// `token_claim.lua` and `token_release.lua`: the user's token, used tokens and uses, then the
/// target's purchases per user.
pub(super) fn token_claim_keys(target: QueueTarget, user: &UserId) -> [String; 4] {
    [
        keys::token(target, user),
        keys::used_tokens(target, user),
        keys::token_uses(target, user),
        keys::of(target, "bought"),
    ]
}

/// `token_claim.lua`: the target's (or the part's) purchases per user and pacing keys
/// ([`GATE_PACE_KEYS`]), then each claim's user's token, used tokens and uses.
pub(super) fn token_claim_shared_keys<'a>(
    part: QueueTarget,
    users: impl IntoIterator<Item = &'a UserId>,
) -> Vec<String> {
    let mut out = vec![keys::of(part, "bought")];
    out.extend(GATE_PACE_KEYS.iter().map(|k| keys::of(part, k)));
    for user in users {
        out.extend([keys::token(part, user), keys::used_tokens(part, user), keys::token_uses(part, user)]);
    }
    out
}

/// `issue.lua`: the target's keys of [`ISSUE_KEYS`], the user's token key, then, when the call
/// drops the target from the user's holds (`hold_generation`), the generations of the one bucket
/// of a single server.
pub(super) fn issue_keys(target: QueueTarget, user: &UserId, hold_generation: Option<u64>) -> Vec<String> {
    let mut out: Vec<String> = ISSUE_KEYS.iter().map(|k| keys::of(target, k)).collect();
    out.push(keys::token(target, user));
    out.extend(hold_generation.into_iter().flat_map(enter_hold_keys));
    out
}

/// `leave.lua`: the target's keys of [`LEAVE_KEYS`], then, when the call drops the target from
/// the user's holds (`hold_generation`), the generations of the one bucket of a single server.
pub(super) fn leave_keys(target: QueueTarget, hold_generation: Option<u64>) -> Vec<String> {
    let mut out: Vec<String> = LEAVE_KEYS.iter().map(|k| keys::of(target, k)).collect();
    out.extend(hold_generation.into_iter().flat_map(enter_hold_keys));
    out
}

/// `user_hold.lua`: the bucket's generations before, at and after `generation`.
pub(super) fn user_hold_keys(bucket: u32, generation: u64) -> [String; 3] {
    [generation.saturating_sub(1), generation, generation + 1].map(|g| keys::user_holds(bucket, g))
}

/// `enter.lua`'s keys after the sale's when it counts the queues each user holds: the
/// generations of the one bucket of a single server (`holds.rs`).
pub(super) fn enter_hold_keys(generation: u64) -> [String; 3] {
    user_hold_keys(0, generation)
}

/// Where a script call's arguments go: a command being built, an invocation, or bytes.
#[doc(hidden)]
pub trait Sink {
    fn put<T: ToRedisArgs>(&mut self, value: T);
}

impl Sink for Cmd {
    fn put<T: ToRedisArgs>(&mut self, value: T) {
        self.arg(value);
    }
}

impl Sink for Invocation<'_> {
    fn put<T: ToRedisArgs>(&mut self, value: T) {
        self.arg(value);
    }
}

impl Sink for Vec<Vec<u8>> {
    fn put<T: ToRedisArgs>(&mut self, value: T) {
        value.write_redis_args(self);
    }
}

/// One script's declared ARGV.
pub trait ScriptArgs {
    /// The script's file in `lua/`.
    const FILE: &'static str;
    /// Its arguments' names, in ARGV order.
    const NAMES: &'static [&'static str];
    /// The names of its variadic tail's items, in the order each item's arguments go.
    const TAIL: &'static [&'static str];
    /// Writes the declared arguments, in order.
    #[doc(hidden)]
    fn put_into(&self, sink: &mut impl Sink);
    /// The declared arguments as sent (for tests and benchmarks that call a script directly).
    fn argv(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        self.put_into(&mut out);
        out
    }
}

/// Declares a script's arguments: `Name<'a> for "file.lua" { field: Type, fixed = value, … }
/// tail [item, …]`. Fields are set by the caller; `name = value` entries are sent as the value.
macro_rules! script_args {
    (
        $(#[$doc:meta])*
        pub struct $name:ident $(<$lt:lifetime>)? for $file:literal { $($body:tt)* } tail [$($tail:ident),*]
    ) => {
        script_args!(@parse [$(#[$doc])*] $name [$($lt)?] $file [$($tail),*]; fields[] put[] names[]; $($body)*);
    };
    (@parse $docs:tt $name:ident $lts:tt $file:literal $tail:tt;
        fields[$($f:tt)*] put[$($p:tt)*] names[$($n:tt)*]; $field:ident : $ty:ty, $($rest:tt)*) => {
        script_args!(@parse $docs $name $lts $file $tail;
            fields[$($f)* $field: $ty,] put[$($p)* (field $field)] names[$($n)* $field]; $($rest)*);
    };
    (@parse $docs:tt $name:ident $lts:tt $file:literal $tail:tt;
        fields[$($f:tt)*] put[$($p:tt)*] names[$($n:tt)*]; $field:ident = $e:expr, $($rest:tt)*) => {
        script_args!(@parse $docs $name $lts $file $tail;
            fields[$($f)*] put[$($p)* (fixed $e)] names[$($n)* $field]; $($rest)*);
    };
    (@parse [$(#[$doc:meta])*] $name:ident [$($lt:lifetime)?] $file:literal [$($tail:ident),*];
        fields[$($field:ident: $ty:ty,)*] put[$($p:tt)*] names[$($n:ident)*]; ) => {
        $(#[$doc])*
        pub struct $name $(<$lt>)? {
            $(pub $field: $ty,)*
        }
        impl $(<$lt>)? ScriptArgs for $name $(<$lt>)? {
            const FILE: &'static str = $file;
            const NAMES: &'static [&'static str] = &[$(stringify!($n)),*];
            const TAIL: &'static [&'static str] = &[$(stringify!($tail)),*];
            fn put_into(&self, sink: &mut impl Sink) {
                let _ = &sink; // a script without arguments writes none
                $(script_args!(@put self sink $p);)*
            }
        }
    };
    (@put $self:ident $sink:ident (field $field:ident)) => {
        $sink.put(&$self.$field)
    };
    (@put $self:ident $sink:ident (fixed $e:expr)) => {
        $sink.put($e)
    };
}

script_args! {
    /// `active_count.lua`: no arguments.
    pub struct ActiveCountArgs for "active_count.lua" {} tail []
}

script_args! {
    /// `admit.lua`: one slice of a tick's admission.
    pub struct AdmitArgs<'a> for "admit.lua" {
        default_batch: u64,
        tick_ms: u64,
        key_ttl_s: u64,
        instance: &'a str,
        ledger_max = LEDGER_MAX_ROWS,
        mark_seen: u64,
        seq_seen: u64,
        seq_to: u64,
        tick_seen: u64,
        record_ttl_s: u64,
        wait_buckets = WAIT_BUCKET_EDGES.as_str(),
        admissions_kept = ADMISSIONS_KEPT,
        events_max: u64,
        admitted_every: u64,
        slice: u64,
        continuation: &'a str,
        // A sharded target's plan (both or neither: `None` sends nothing).
        plan_tick: Option<u64>,
        plan_share: Option<u64>,
    } tail []
}

script_args! {
    /// `enter.lua`: the arguments before its users. The `hold_*` ones count the queues each
    /// user given a place holds (`queue.max_queues_per_user`) in the same call, with the keys of
    /// [`enter_hold_keys`] after the sale's; `hold_max` 0: no count, no such keys.
    pub struct EnterArgs<'a> for "enter.lua" {
        capacity: u64,
        key_ttl_s: u64,
        seq_seen: u64,
        seq_to: u64,
        mark_seen: u64,
        tick_ms: u64,
        record_ttl_s: u64,
        ttl_refresh_every = TTL_REFRESH_EVERY,
        hold_max: u64,
        hold_target: &'a str,
        hold_generation: u64,
        hold_generation_ms: u64,
    } tail [user]
}

script_args! {
    /// `events_lease.lua`.
    pub struct EventsLeaseArgs<'a> for "events_lease.lua" {
        holder: &'a str,
        lease_ms: u64,
    } tail []
}

script_args! {
    /// `evict.lua`.
    pub struct EvictArgs for "evict.lua" {
        timeout_ms: u64,
        max: u64,
        key_ttl_s: u64,
        record_ttl_s: u64,
        sweep_seqs = SWEEP_SEQS,
    } tail []
}

script_args! {
    /// `flag_ack.lua`.
    pub struct FlagAckArgs<'a> for "flag_ack.lua" {
        instance: &'a str,
        version: u64,
        applied_at_ms: u64,
        ttl_ms: u64,
        missing: &'a str,
        state: &'a str,
        keep_ms = FLAG_ACK_KEEP_MS,
    } tail []
}

script_args! {
    /// `flag_acks.lua`.
    pub struct FlagAcksArgs for "flag_acks.lua" {
        keep_ms = FLAG_ACK_KEEP_MS,
    } tail []
}

script_args! {
    /// `flag_set.lua`: the arguments before the fields.
    pub struct FlagSetArgs<'a> for "flag_set.lua" {
        set_count: usize,
        clear_overrides: &'a str,
        version_floor: u64,
    } tail [fields]
}

script_args! {
    /// `gate_pace.lua`.
    pub struct GatePaceArgs for "gate_pace.lua" {
        tick_ms: u64,
        default_budget: u64,
        guard_ms = PACE_GUARD_MS,
        ahead: u64,
    } tail []
}

script_args! {
    /// `issue.lua`.
    pub struct IssueArgs<'a> for "issue.lua" {
        user: &'a str,
        token: &'a str,
        token_ttl_s: u64,
        record_ttl_s: u64,
        hold_target: &'a str,
        hold_generation: u64,
        hold_generation_ms: u64,
    } tail []
}

script_args! {
    /// `lane_join.lua`.
    pub struct LaneJoinArgs<'a> for "lane_join.lua" {
        user: &'a str,
        code_hash: &'a str,
        lane: &'a str,
        lanes: &'a str,
        key_ttl_s: u64,
    } tail []
}

script_args! {
    /// `leave.lua`.
    pub struct LeaveArgs<'a> for "leave.lua" {
        user: &'a str,
        key_ttl_s: u64,
        record_ttl_s: u64,
        hold_target: &'a str,
        hold_generation: u64,
        hold_generation_ms: u64,
    } tail []
}

script_args! {
    /// `outflow_claim.lua`.
    pub struct OutflowClaimArgs for "outflow_claim.lua" {
        interval: u64,
        key_ttl_s: u64,
    } tail []
}

script_args! {
    /// `outflow_observe.lua`.
    pub struct OutflowObserveArgs<'a> for "outflow_observe.lua" {
        buyer: &'a str,
        bucket: usize,
        error: u8,
        backoff: u8,
        observations_ttl_s: u64,
        buyers_ttl_s: u64,
    } tail []
}

script_args! {
    /// `admit_milestones.lua`.
    pub struct AdmitMilestonesArgs for "admit_milestones.lua" {
        tick: u64,
        admitted: u64,
        batch: u64,
        waiting: u64,
        mark: u64,
        admitted_every: u64,
        events_max: u64,
        events_ttl_s: u64,
    } tail []
}

script_args! {
    /// `outflow_set.lua`: the arguments before the decision's fields.
    pub struct OutflowSetArgs<'a> for "outflow_set.lua" {
        key_ttl_s: u64,
        row: &'a str,
        ledger_max = LEDGER_MAX_ROWS,
        events_max: u64,
        events_ttl_s: u64,
    } tail [fields]
}

script_args! {
    /// `sale_control.lua`.
    pub struct SaleControlArgs<'a> for "sale_control.lua" {
        action: &'a str,
        source: &'a str,
        message: &'a str,
        key_ttl_s: u64,
        ledger_max = LEDGER_MAX_ROWS,
        record_ttl_s: u64,
        force: u8,
        events_max: u64,
    } tail []
}

script_args! {
    /// `sale_place.lua`: the arguments before the places.
    pub struct SalePlaceArgs<'a> for "sale_place.lua" {
        last: &'a str,
        opens_at_ms: u64,
        key_ttl_s: u64,
        ledger_max = LEDGER_MAX_ROWS,
        record_ttl_s: u64,
        events_max: u64,
    } tail [places]
}

script_args! {
    /// `sale_read.lua`: no arguments.
    pub struct SaleReadArgs for "sale_read.lua" {} tail []
}

script_args! {
    /// `sale_schedule.lua`.
    pub struct SaleScheduleArgs<'a> for "sale_schedule.lua" {
        opens_at_ms: u64,
        prequeue_from_ms: &'a str,
        closes_at_ms: &'a str,
        seed: &'a str,
        commitment: &'a str,
        expire_at_s: u64,
        ledger_max = LEDGER_MAX_ROWS,
        record_ttl_s: u64,
        events_max: u64,
    } tail []
}

script_args! {
    /// `status.lua`: the arguments before its users (the users, then a token for each).
    pub struct StatusArgs<'a> for "status.lua" {
        mark_seen: u64,
        key_ttl_s: u64,
        token_ttl_s: u64,
        record_ttl_s: u64,
        hold_target: &'a str,
        hold_generation: u64,
        hold_generation_ms: u64,
    } tail [user, token]
}

script_args! {
    /// `token_claim.lua`: the arguments before its claims.
    pub struct TokenClaimArgs for "token_claim.lua" {
        per_admission: u64,
        per_user: u64,
        key_ttl_s: u64,
        pace_tick_ms: u64,
        pace_budget: u64,
        pace_guard_ms = PACE_GUARD_MS,
        pace_ahead: u64,
    } tail [token, ttl_s, user]
}

script_args! {
    /// `token_release.lua`.
    pub struct TokenReleaseArgs<'a> for "token_release.lua" {
        token: &'a str,
        previous: &'a str,
        per_admission: u64,
        per_user: u64,
        user: &'a str,
    } tail []
}

script_args! {
    /// `tokens_expire.lua`.
    pub struct TokensExpireArgs for "tokens_expire.lua" {
        max: u64,
    } tail []
}

script_args! {
    /// `user_hold.lua`: the arguments before its entries.
    pub struct UserHoldArgs for "user_hold.lua" {
        generation: u64,
        generation_ms: u64,
    } tail [user, target]
}

script_args! {
    /// `view.lua`: the arguments before its users.
    pub struct ViewArgs for "view.lua" {
        departed_max: usize,
    } tail [user]
}

/// Every declaration: file, names, tail.
#[cfg(test)]
const ALL: &[(&str, &[&str], &[&str])] = {
    macro_rules! of {
        ($($t:ty),* $(,)?) => {
            &[$((<$t>::FILE, <$t>::NAMES, <$t>::TAIL)),*]
        };
    }
    of![
        ActiveCountArgs,
        AdmitArgs<'static>,
        AdmitMilestonesArgs,
        EnterArgs<'static>,
        EventsLeaseArgs<'static>,
        EvictArgs,
        FlagAckArgs<'static>,
        FlagAcksArgs,
        FlagSetArgs<'static>,
        GatePaceArgs,
        IssueArgs<'static>,
        LaneJoinArgs<'static>,
        LeaveArgs<'static>,
        OutflowClaimArgs,
        OutflowObserveArgs<'static>,
        OutflowSetArgs<'static>,
        SaleControlArgs<'static>,
        SalePlaceArgs<'static>,
        SaleReadArgs,
        SaleScheduleArgs<'static>,
        StatusArgs<'static>,
        TokenClaimArgs,
        TokenReleaseArgs<'static>,
        TokensExpireArgs,
        UserHoldArgs,
        ViewArgs,
    ]
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The ARGV names of a script's header: `-- ARGV[<digits>] <name>: …` lines in order, and
    /// the names of its tail's lines (`-- ARGV[<k>+i] <name>: …`, `-- ARGV[<k>..] <name>: …`).
    fn header_argv(script: &str) -> (Vec<String>, Vec<String>) {
        let (mut fixed, mut tail) = (Vec::new(), Vec::new());
        for line in script.lines() {
            let Some((index, rest)) = line.strip_prefix("-- ARGV[").and_then(|r| r.split_once("] ")) else {
                continue;
            };
            let name = rest.split_once(':').map(|(n, _)| n).filter(|n| {
                !n.is_empty() && n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            });
            let name = name.unwrap_or_else(|| panic!("`{line}` names no argument (`-- ARGV[i] name: what`)"));
            if index.chars().all(|c| c.is_ascii_digit()) {
                assert_eq!(index.parse::<usize>().ok(), Some(fixed.len() + 1), "{line}: out of order");
                fixed.push(name.to_owned());
            } else {
                tail.push(name.to_owned());
            }
        }
        (fixed, tail)
    }

    fn script_text(file: &str) -> String {
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua").join(file))
            .expect("script")
    }

    #[test]
    fn every_script_declares_its_arguments_as_its_header_names_them() {
        let files = super::super::scripts::tests::script_files();
        let declared: Vec<&str> = ALL.iter().map(|(f, _, _)| *f).collect();
        assert_eq!(declared, files, "one declaration per script of lua/, in order");
        for (file, names, tail) in ALL {
            let (fixed, tail_names) = header_argv(&script_text(file));
            assert_eq!(&fixed, names, "{file}: ARGV in the header and in the declaration");
            assert_eq!(&tail_names, tail, "{file}: the variadic tail's names");
        }
    }

    /// The `-- KEYS[i] <pattern>` lines of a script, in order.
    fn header_key_patterns(script: &str) -> Vec<String> {
        script
            .lines()
            .filter_map(|l| l.strip_prefix("-- KEYS[")?.split_once("] "))
            .map(|(_, rest)| rest.split_whitespace().next().unwrap_or_default().to_owned())
            .collect()
    }

    /// The scripts whose keys are not only named target keys: the keys their calls build are
    /// the header's patterns with target LIMITED_DROP:1, user u1, webhook w, interval 7,
    /// bucket 3 and generation 10.
    #[test]
    fn key_builders_are_the_script_headers() {
        let target: QueueTarget = "LIMITED_DROP:1".parse().expect("target");
        let user: UserId = "u1".parse().expect("user");
        let render = |p: &str| {
            p.replace("{T}", "{LIMITED_DROP:1}")
                .replace("{user}", "u1")
                .replace("<name>", "w")
                .replace("<i>", "7")
                .replace("{h<b>}", "{h3}")
                .replace("<g-1>", "9")
                .replace("<g+1>", "11")
                .replace("<g>", "10")
        };
        let owned = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        let cases: [(&str, Vec<String>); 11] = [
            ("events_lease.lua", events_lease_keys("w").to_vec()),
            ("issue.lua", issue_keys(target, &user, Some(10))),
            ("leave.lua", leave_keys(target, Some(10))),
            ("flag_ack.lua", owned(&FLAG_ACK_KEYS)),
            ("flag_acks.lua", owned(&FLAG_ACK_KEYS)),
            ("flag_set.lua", owned(&FLAG_SET_KEYS)),
            ("outflow_claim.lua", outflow_claim_keys(target, 7).to_vec()),
            ("outflow_observe.lua", outflow_observe_keys(target, 7).to_vec()),
            ("token_claim.lua", token_claim_shared_keys(target, [&user])),
            ("token_release.lua", token_claim_keys(target, &user).to_vec()),
            ("user_hold.lua", user_hold_keys(3, 10).to_vec()),
        ];
        for (file, built) in cases {
            let want: Vec<String> = header_key_patterns(&script_text(file)).iter().map(|p| render(p)).collect();
            assert_eq!(built, want, "{file}: the keys its call builds and its header");
        }
        // enter.lua's keys of the holds, after the target's and the sale's.
        let holds: Vec<String> = header_key_patterns(&script_text("enter.lua"))
            .iter()
            .filter(|p| p.starts_with("queue:holds:"))
            .map(|p| render(p))
            .collect();
        assert_eq!(enter_hold_keys(10).to_vec(), holds, "enter.lua: the holds' keys");
    }

    #[test]
    fn a_declaration_sends_its_fields_and_fixed_values_in_order() {
        let args = EnterArgs {
            capacity: 1,
            key_ttl_s: 2,
            seq_seen: 3,
            seq_to: 4,
            mark_seen: 5,
            tick_ms: 6,
            record_ttl_s: 7,
            hold_max: 8,
            hold_target: "LIMITED_DROP:9",
            hold_generation: 10,
            hold_generation_ms: 11,
        };
        let sent: Vec<String> = args.argv().into_iter().map(|a| String::from_utf8(a).expect("utf-8")).collect();
        let every = TTL_REFRESH_EVERY.to_string();
        assert_eq!(sent, ["1", "2", "3", "4", "5", "6", "7", &every, "8", "LIMITED_DROP:9", "10", "11"]);
        assert_eq!(sent.len(), EnterArgs::NAMES.len());
    }
}
