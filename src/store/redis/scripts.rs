//! The Lua scripts (one per atomic operation, see `lua/`), how they are run, and the
//! helpers that read their replies.
//!
//! Every script runs as a Redis function of one library, [`LIBRARY`], generated here from
//! `lua/`: `lua/prelude.lua` once (its definitions are made when the library loads, on each
//! node, not on every call), then each script as the body of a function. The library's name
//! carries a hash of its text (`vq_<hash>`, its functions `vq_<hash>_<script>`), so two vq
//! versions on one Redis never collide and a changed script is a new library. The library is
//! loaded when a call finds it missing (a new node, a restart, `FUNCTION FLUSH`), on the node
//! that serves the call's key. Where Redis refuses functions (an older Redis, an ACL without
//! `FCALL` or `FUNCTION`), each script goes as EVALSHA of the prelude and the script, as text.
//!
//! Written once on each side and checked against each other by the tests below: the reply
//! codes ([`Code`], the `local` constants of `lua/prelude.lua`), the sale's fields
//! (`codec::SALE_FIELDS`, the prelude's `SALE_FIELDS`), and each script's KEYS order (the
//! `*_KEYS` lists of `layout.rs`, the `-- KEYS[i]` lines of its header). Each script's ARGV is
//! declared in `layout.rs` and checked against its header there.

use std::fmt::Write as _;
use std::sync::LazyLock;

use redis::{Cmd, FromRedisValue, RedisError, RedisResult, Script, ToRedisArgs};

use super::conn::Conn;
use super::keys;
pub(super) use super::layout::{
    ACTIVE_COUNT_KEYS, ADMIT_KEYS, ENTER_KEYS, EVICT_KEYS, GATE_PACE_KEYS, LANE_JOIN_KEYS, LEAVE_KEYS,
    OUTFLOW_SET_KEYS, SALE_CONTROL_KEYS, SALE_KEYS, SALE_PLACE_KEYS, SALE_READ_KEYS, SALE_SCHEDULE_KEYS, STATUS_KEYS,
    TOKENS_EXPIRE_KEYS, VIEW_KEYS,
};
use super::layout::{ScriptArgs, Sink};
use crate::domain::QueueTarget;
use crate::store::StoreError;

macro_rules! lua {
    ($file:literal) => {
        include_str!(concat!("../../../lua/", $file))
    };
}

const PRELUDE: &str = lua!("prelude.lua");

/// One script of `lua/` and how it runs as a function.
struct Def {
    /// The file's name; its stem names the function.
    file: &'static str,
    body: &'static str,
    /// Whether its EVALSHA form has the prelude in front (`events_lease.lua` needs none of it).
    prelude: bool,
    /// The function's flags. Redis refuses a function without flags while it is out of memory
    /// (`maxmemory`), where it ran an EVAL script up to its first write that needs memory:
    /// `allow-oom` for the scripts that EVAL ran there on some path (their first write frees
    /// memory: a purchase's claim and its release, a leave, the tokens' expiry, the
    /// acknowledgements' sweep, a flag or sale control an operator needs then); `no-writes`
    /// for those that only read.
    flags: &'static [&'static str],
}

const ALLOW_OOM: &[&str] = &["allow-oom"];
const NO_WRITES: &[&str] = &["no-writes"];

macro_rules! def {
    ($file:literal) => {
        def!($file, &[])
    };
    ($file:literal, $flags:expr) => {
        Def { file: $file, body: lua!($file), prelude: true, flags: $flags }
    };
}

/// Every script vq runs.
const DEFS: &[Def] = &[
    def!("active_count.lua", NO_WRITES),
    def!("admit.lua"),
    def!("admit_milestones.lua"),
    def!("enter.lua"),
    Def { file: "events_lease.lua", body: lua!("events_lease.lua"), prelude: false, flags: &[] },
    def!("evict.lua"),
    def!("flag_ack.lua"),
    def!("flag_acks.lua", ALLOW_OOM),
    def!("flag_set.lua", ALLOW_OOM),
    def!("gate_pace.lua"),
    def!("issue.lua"),
    def!("lane_join.lua"),
    def!("leave.lua", ALLOW_OOM),
    def!("outflow_claim.lua"),
    def!("outflow_observe.lua"),
    def!("outflow_set.lua"),
    def!("sale_control.lua", ALLOW_OOM),
    def!("sale_place.lua"),
    def!("sale_read.lua", NO_WRITES),
    def!("sale_schedule.lua"),
    def!("status.lua"),
    def!("token_claim.lua", ALLOW_OOM),
    def!("token_release.lua", ALLOW_OOM),
    def!("tokens_expire.lua", ALLOW_OOM),
    def!("user_hold.lua"),
    def!("view.lua"),
];

/// The one library of functions: its name and text (`FUNCTION LOAD`).
pub(super) struct Library {
    pub(super) name: String,
    pub(super) text: String,
}

pub(super) static LIBRARY: LazyLock<Library> = LazyLock::new(|| Library::of(PRELUDE, DEFS));

impl Library {
    /// The library of `defs` after `prelude`, named by a hash of its text.
    fn of(prelude: &str, defs: &[Def]) -> Self {
        let hash = Script::new(&library_text("vq", prelude, defs)).get_hash()[..16].to_owned();
        let name = format!("vq_{hash}");
        Self { text: library_text(&name, prelude, defs), name }
    }
}

/// The library's text: the prelude once, then each script as a function's body. `KEYS` and
/// `ARGV` are locals of the library that each call sets first, so the prelude's helpers and the
/// bodies read them as they read EVAL's globals. A script with a [`CALL_MARK`] line has what
/// comes before it (its own helpers, defined once) in a `do … end` block of the library, around
/// its function, whose body is what follows the line.
fn library_text(name: &str, prelude: &str, defs: &[Def]) -> String {
    let mut text = format!(
        "#!lua name={name}\n-- vq's scripts (lua/) as functions, generated by src/store/redis/scripts.rs\n\
         local KEYS, ARGV\n{prelude}\n"
    );
    for def in defs {
        let flags: Vec<String> = def.flags.iter().map(|f| format!("'{f}'")).collect();
        let (once, body) = split_at_call(def.body);
        if let Some(once) = once {
            let _ = writeln!(text, "do\n{once}");
        }
        let _ = write!(
            text,
            "redis.register_function{{function_name = '{name}_{stem}', flags = {{{flags}}}, \
             callback = function(keys, argv)\nKEYS, ARGV = keys, argv\n{body}\nend}}\n",
            stem = stem(def.file),
            flags = flags.join(", "),
        );
        if once.is_some() {
            text.push_str("end\n");
        }
    }
    text
}

/// The line of a script after which its call begins (`admit.lua`); what comes before it runs
/// once, when the library loads (as EVALSHA, all of it on every call).
const CALL_MARK: &str = "\n-- vq:call";

/// A script's definitions made once and its call, when it has a [`CALL_MARK`] line.
fn split_at_call(body: &str) -> (Option<&str>, &str) {
    match body.find(CALL_MARK) {
        Some(at) => (Some(&body[..at]), &body[at + 1..]),
        None => (None, body),
    }
}

fn stem(file: &str) -> &str {
    file.strip_suffix(".lua").unwrap_or(file)
}

/// One script as vq runs it: a function of [`LIBRARY`], or, where Redis refuses functions, the
/// same text (the prelude and the script) as EVALSHA. Called as `redis::Script` is.
pub(super) struct Function {
    /// The script's file in `lua/`.
    file: &'static str,
    /// `vq_<hash>_<stem>`.
    name: String,
    script: Script,
}

impl Function {
    fn of(file: &str) -> Self {
        let def = DEFS.iter().find(|d| d.file == file).expect("every script vq runs is in DEFS");
        let text = if def.prelude { format!("{PRELUDE}\n{}", def.body) } else { def.body.to_owned() };
        Self { file: def.file, name: format!("{}_{}", LIBRARY.name, stem(file)), script: Script::new(&text) }
    }

    /// `args`, the declaration of this script's arguments, written into `sink` (a call of it).
    pub(super) fn put_args<A: ScriptArgs>(&self, sink: &mut impl Sink, args: &A) {
        debug_assert_eq!(A::FILE, self.file, "the arguments of another script");
        args.put_into(sink);
    }

    pub(super) fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation { function: self, keys: Vec::new(), args: Vec::new() }
    }

    pub(super) fn key<T: ToRedisArgs>(&self, key: T) -> Invocation<'_> {
        let mut inv = self.prepare_invoke();
        inv.key(key);
        inv
    }

    /// A call of this script with `numkeys` keys, as `conn` runs scripts now (`FCALL`, or
    /// `EVALSHA` where functions are refused); its keys, then its arguments, follow.
    pub(super) fn cmd(&self, conn: &Conn, numkeys: usize) -> Cmd {
        let mut cmd = if conn.runs_functions() {
            let mut c = redis::cmd("FCALL");
            c.arg(&self.name);
            c
        } else {
            let mut c = redis::cmd("EVALSHA");
            c.arg(self.script.get_hash());
            c
        };
        cmd.arg(numkeys);
        cmd
    }

    /// Runs `cmd` (from [`Function::cmd`]). A function missing on the node (a new node, a
    /// restart, `FUNCTION FLUSH`) loads the library there and runs again; missing again each
    /// time (the library flushed between the load and the call, [`LOADS_PER_CALL`] times),
    /// this one call runs as EVALSHA, so it never fails for it. Functions refused, it runs as
    /// EVALSHA, which loads the script on NOSCRIPT.
    pub(super) async fn call<T: FromRedisValue>(&self, conn: &mut Conn, cmd: &Cmd) -> RedisResult<T> {
        if !is_fcall(cmd) {
            return self.evalsha(conn, cmd).await;
        }
        // Why functions are set aside for a while, if they are; this one call goes as EVALSHA
        // either way once the loop ends.
        let mut loads = 0;
        let refused = loop {
            match cmd.query_async(conn).await {
                Err(e) if function_missing(&e) && loads < LOADS_PER_CALL => {
                    loads += 1;
                    if let Err(e) = load_library(conn, first_key(cmd)).await {
                        break Some(format!("redis did not load vq's functions ({e})"));
                    }
                }
                Err(e) if function_missing(&e) => {
                    tracing::debug!("vq's functions were gone again after {loads} loads: this call goes as EVALSHA");
                    break None;
                }
                Err(e) if functions_refused(&e) => break Some(format!("redis refuses functions ({e})")),
                other => return other,
            }
        };
        if let Some(why) = refused {
            tracing::warn!("{why}: scripts go as EVALSHA for a while");
            conn.refuse_functions();
        }
        self.evalsha(conn, &self.as_evalsha(cmd)).await
    }

    /// Runs an EVALSHA; on NOSCRIPT (Redis restarted, failover, a new cluster node) loads the
    /// script and runs it again.
    async fn evalsha<T: FromRedisValue>(&self, conn: &mut Conn, cmd: &Cmd) -> RedisResult<T> {
        match cmd.query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                cmd.query_async(conn).await
            }
            other => other,
        }
    }

    /// The EVALSHA of an FCALL's keys and arguments.
    fn as_evalsha(&self, fcall: &Cmd) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash());
        for arg in fcall.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        cmd
    }
}

/// Loads of the library one call makes when its function is missing before it runs as EVALSHA
/// (the library flushed again between each load and the call).
const LOADS_PER_CALL: u32 = 3;

fn is_fcall(cmd: &Cmd) -> bool {
    matches!(cmd.args_iter().next(), Some(redis::Arg::Simple(b"FCALL")))
}

/// The first key of a script call (`FCALL name numkeys key…`), if it has one.
fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().skip(2);
    let numkeys = match args.next() {
        Some(redis::Arg::Simple(n)) => std::str::from_utf8(n).ok()?.parse::<usize>().ok()?,
        _ => return None,
    };
    match args.next() {
        Some(redis::Arg::Simple(key)) if numkeys > 0 => Some(key),
        _ => None,
    }
}

/// `FCALL` of a function the node does not hold.
fn function_missing(e: &RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.starts_with("Function not found"))
}

/// `FCALL` refused outright: a Redis without functions, or an ACL without them.
fn functions_refused(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        || (e.code() == Some("ERR") && e.detail().is_some_and(|d| d.starts_with("unknown command")))
}

/// Loads [`LIBRARY`] on the node that serves `key`; the library already there (another call
/// loaded it first) is no failure.
async fn load_library(conn: &mut Conn, key: Option<&[u8]>) -> RedisResult<()> {
    let mut cmd = redis::cmd("FUNCTION");
    cmd.arg("LOAD").arg(&LIBRARY.text);
    match conn.on_node_of(key, &cmd).await {
        Ok(_) => Ok(()),
        Err(e) if e.detail().is_some_and(|d| d.contains("already exists")) => Ok(()),
        Err(e) => Err(e),
    }
}

/// An invocation of a [`Function`]: its keys and arguments, as `redis::ScriptInvocation`'s.
pub(super) struct Invocation<'a> {
    function: &'a Function,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    pub(super) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The script's declared arguments (`layout.rs`), in their order; a variadic tail follows
    /// with [`Invocation::arg`].
    pub(super) fn args<A: ScriptArgs>(&mut self, args: &A) -> &mut Self {
        let function = self.function;
        function.put_args(self, args);
        self
    }

    pub(super) async fn invoke_async<T: FromRedisValue>(&self, conn: &mut Conn) -> RedisResult<T> {
        let mut cmd = self.function.cmd(conn, self.keys.len());
        for k in &self.keys {
            cmd.arg(k.as_slice());
        }
        for a in &self.args {
            cmd.arg(a.as_slice());
        }
        self.function.call(conn, &cmd).await
    }
}

pub(super) static ENTER: LazyLock<Function> = LazyLock::new(|| Function::of("enter.lua"));
pub(super) static STATUS: LazyLock<Function> = LazyLock::new(|| Function::of("status.lua"));
pub(super) static ISSUE: LazyLock<Function> = LazyLock::new(|| Function::of("issue.lua"));

/// `domain::stats::WAIT_BUCKETS` as `admit.lua` takes it (`wait_buckets`): "below:width ...".
pub(super) static WAIT_BUCKET_EDGES: LazyLock<String> = LazyLock::new(|| {
    crate::domain::WAIT_BUCKETS.iter().map(|(below, width)| format!("{below}:{width}")).collect::<Vec<_>>().join(" ")
});

/// An invocation of `script` with `target`'s keys `names`, in that order.
pub(super) fn on_target<'a>(script: &'a Function, target: QueueTarget, names: &[&str]) -> Invocation<'a> {
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
    /// enter.lua only, when it counts the queues each user holds: `a` names them.
    TooMany = 9,
}

impl Code {
    pub(super) fn of(n: u64) -> Option<Code> {
        u8::try_from(n).ok().and_then(Code::from_repr)
    }
}
pub(super) static LANE_JOIN: LazyLock<Function> = LazyLock::new(|| Function::of("lane_join.lua"));
pub(super) static LEAVE: LazyLock<Function> = LazyLock::new(|| Function::of("leave.lua"));
pub(super) static ADMIT: LazyLock<Function> = LazyLock::new(|| Function::of("admit.lua"));
pub(super) static EVICT: LazyLock<Function> = LazyLock::new(|| Function::of("evict.lua"));
pub(super) static TOKEN_CLAIM: LazyLock<Function> = LazyLock::new(|| Function::of("token_claim.lua"));
pub(super) static TOKEN_RELEASE: LazyLock<Function> = LazyLock::new(|| Function::of("token_release.lua"));
pub(super) static GATE_PACE: LazyLock<Function> = LazyLock::new(|| Function::of("gate_pace.lua"));
pub(super) static FLAG_SET: LazyLock<Function> = LazyLock::new(|| Function::of("flag_set.lua"));
pub(super) static FLAG_ACK: LazyLock<Function> = LazyLock::new(|| Function::of("flag_ack.lua"));
pub(super) static FLAG_ACKS: LazyLock<Function> = LazyLock::new(|| Function::of("flag_acks.lua"));
pub(super) static SALE_SCHEDULE: LazyLock<Function> = LazyLock::new(|| Function::of("sale_schedule.lua"));
pub(super) static SALE_CONTROL: LazyLock<Function> = LazyLock::new(|| Function::of("sale_control.lua"));
pub(super) static SALE_PLACE: LazyLock<Function> = LazyLock::new(|| Function::of("sale_place.lua"));
pub(super) static SALE_READ: LazyLock<Function> = LazyLock::new(|| Function::of("sale_read.lua"));
pub(super) static TOKENS_EXPIRE: LazyLock<Function> = LazyLock::new(|| Function::of("tokens_expire.lua"));
pub(super) static ACTIVE_COUNT: LazyLock<Function> = LazyLock::new(|| Function::of("active_count.lua"));
pub(super) static OUTFLOW_SET: LazyLock<Function> = LazyLock::new(|| Function::of("outflow_set.lua"));
pub(super) static ADMIT_MILESTONES: LazyLock<Function> = LazyLock::new(|| Function::of("admit_milestones.lua"));
pub(super) static OUTFLOW_OBSERVE: LazyLock<Function> = LazyLock::new(|| Function::of("outflow_observe.lua"));
pub(super) static OUTFLOW_CLAIM: LazyLock<Function> = LazyLock::new(|| Function::of("outflow_claim.lua"));
pub(super) static USER_HOLD: LazyLock<Function> = LazyLock::new(|| Function::of("user_hold.lua"));
pub(super) static VIEW: LazyLock<Function> = LazyLock::new(|| Function::of("view.lua"));
pub(super) static EVENTS_LEASE: LazyLock<Function> = LazyLock::new(|| Function::of("events_lease.lua"));

pub(super) fn reply_err(what: &'static str, reply: &[String]) -> StoreError {
    StoreError::Reply { what, detail: format!("{reply:?}") }
}

pub(super) fn num(what: &'static str, reply: &[String], i: usize) -> Result<u64, StoreError> {
    reply.get(i).and_then(|s| s.parse::<u64>().ok()).ok_or_else(|| reply_err(what, reply))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::store::redis::layout::ISSUE_KEYS;

    /// The prelude's `local NAME = <number>` lines (constants are named in capitals).
    fn lua_constants() -> Vec<(String, u64)> {
        PRELUDE
            .lines()
            .filter_map(|l| l.strip_prefix("local ")?.split_once(" = "))
            .filter(|(name, _)| name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            .filter_map(|(name, v)| Some((name.to_owned(), v.trim().parse().ok()?)))
            .collect()
    }

    #[test]
    fn the_library_is_named_by_its_text_and_names_its_functions_after_itself() {
        assert_eq!(Library::of(PRELUDE, DEFS).name, LIBRARY.name);
        assert!(LIBRARY.text.starts_with(&format!("#!lua name={}\n", LIBRARY.name)));
        assert!(ENTER.name.starts_with(&LIBRARY.name) && ENTER.name.ends_with("_enter"), "{}", ENTER.name);
        assert!(LIBRARY.text.contains(&format!("function_name = '{}'", ENTER.name)));
        // A script's text changed by one character, or the prelude's, is another library.
        let changed: Vec<Def> = DEFS
            .iter()
            .map(|d| Def {
                file: d.file,
                body: if d.file == "view.lua" { Box::leak(format!("{} ", d.body).into_boxed_str()) } else { d.body },
                prelude: d.prelude,
                flags: d.flags,
            })
            .collect();
        let other = Library::of(PRELUDE, &changed);
        assert_ne!(other.name, LIBRARY.name);
        assert!(other.text.contains(&format!("function_name = '{}_enter'", other.name)));
        assert_ne!(Library::of(&format!("{PRELUDE}\n"), DEFS).name, LIBRARY.name);
    }

    /// admit.lua's steps are defined once, at the library's load, beside its function; its
    /// call runs them.
    #[test]
    fn a_scripts_steps_before_its_call_mark_are_defined_once() {
        let admit = DEFS.iter().find(|d| d.file == "admit.lua").expect("admit.lua");
        let (once, call) = split_at_call(admit.body);
        let once = once.expect("admit.lua has a call mark");
        assert!(once.contains("local function take_slice(") && !call.contains("local function"));
        assert!(
            call.starts_with("-- vq:call")
                && call.trim_end().ends_with("table.concat(w.list, ','), fenced, more, continuation}")
        );
        let function = format!("redis.register_function{{function_name = '{}_admit'", LIBRARY.name);
        let (before, after) = LIBRARY.text.split_once(&function).expect("admit's function");
        assert!(before.ends_with(&format!("do\n{once}\n")), "the steps precede the function in a do block");
        assert!(after.contains(&format!("KEYS, ARGV = keys, argv\n{call}\nend}}\nend\n")));
        assert_eq!(split_at_call("return 1"), (None, "return 1"));
    }

    /// The scripts of `lua/` (the prelude aside), sorted.
    pub(in crate::store::redis) fn script_files() -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("lua/")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".lua") && f != "prelude.lua")
            .collect();
        files.sort();
        files
    }

    #[test]
    fn every_script_in_lua_is_a_function_of_the_library() {
        let files = script_files();
        let defs: Vec<&str> = DEFS.iter().map(|d| d.file).collect();
        assert_eq!(defs, files, "DEFS lists every script of lua/, in order");
        for d in DEFS {
            assert_eq!(
                d.body,
                std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua").join(d.file))
                    .expect("script")
            );
        }
    }

    /// A `no-writes` function fails on its first write: those scripts only read.
    #[test]
    fn no_writes_scripts_only_read() {
        const READS: &[&str] = &["GET", "ZCOUNT", "ZCARD", "HGETALL", "HMGET", "MGET", "TIME"];
        for d in DEFS.iter().filter(|d| d.flags == NO_WRITES) {
            for call in d.body.split("redis.call('").skip(1) {
                let command = call.split('\'').next().unwrap_or_default();
                assert!(READS.contains(&command), "{}: {command}", d.file);
            }
        }
    }

    #[test]
    fn used_mark_is_the_preludes() {
        assert!(PRELUDE.contains(&format!("local USED_MARK = '{}'", keys::USED_MARK)));
        assert_eq!(keys::used_token("used:abc"), Some("abc"));
        assert_eq!(keys::used_token("abc"), None);
    }

    /// `sale_read` of the prelude reads the fields the codec decodes, by the same names.
    #[test]
    fn sale_fields_are_the_preludes() {
        let line = PRELUDE
            .lines()
            .find_map(|l| l.strip_prefix("local SALE_FIELDS = {")?.strip_suffix('}'))
            .expect("`local SALE_FIELDS = {…}` in prelude.lua");
        let lua: Vec<&str> = line.split(", ").map(|f| f.trim_matches('\'')).collect();
        assert_eq!(lua, super::super::codec::SALE_FIELDS);
        // sale_read's table: `name = v[i] or nil`, i the name's place in SALE_FIELDS.
        let read = PRELUDE.split("local function sale_read(").nth(1).expect("sale_read");
        let table = read.split("return {").nth(1).and_then(|t| t.split('}').next()).expect("sale_read's table");
        let named: Vec<String> = table.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect();
        let want: Vec<String> = lua.iter().zip(1..).map(|(name, i)| format!("{name} = v[{i}] or nil")).collect();
        assert_eq!(named, want, "sale_read's table names the fields of SALE_FIELDS at their places");
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
        assert_eq!(Code::of(10), None);
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
        let cases: [Case; 17] = [
            (lua!("active_count.lua"), ACTIVE_COUNT_KEYS, &[]),
            (lua!("outflow_set.lua"), OUTFLOW_SET_KEYS, &[]),
            (lua!("admit_milestones.lua"), crate::store::layout::ADMIT_MILESTONES_KEYS, &[]),
            (lua!("tokens_expire.lua"), TOKENS_EXPIRE_KEYS, &[]),
            (lua!("enter.lua"), ENTER_KEYS, SALE_KEYS),
            (lua!("status.lua"), STATUS_KEYS, SALE_KEYS),
            (lua!("issue.lua"), ISSUE_KEYS, &[]),
            (lua!("admit.lua"), ADMIT_KEYS, &[]),
            (lua!("evict.lua"), EVICT_KEYS, &[]),
            (lua!("leave.lua"), LEAVE_KEYS, &[]),
            (lua!("lane_join.lua"), LANE_JOIN_KEYS, &[]),
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
