//! A Lua 5.1 host that runs vq's function library (`FUNCTION LOAD`, `FCALL`) over the
//! [`Keyspace`], as Redis runs it: `redis.call` raises a command's error (Lua's `pcall` catches
//! its message, as in Redis 7.0) and `redis.pcall` returns it as `{err=…}`; replies become Lua values and a script's answer a reply by
//! Redis' conversions (integers truncate, an array stops at its first nil, false is nil, true
//! is 1, `{ok=…}` a status and `{err=…}` an error); "now" stands still while a script runs.
//!
//! It lives on the embedded store's one thread (see `mod.rs`): nothing here is `Send`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use mlua::{Function, Lua, MultiValue, Table, Value};

use super::keyspace::{Keyspace, g17};
use super::reply::Reply;

/// What Redis gives a script besides `redis.call`, in Lua (`__vq_raw` is the command door).
const BOOT: &str = r#"
local raw = __vq_raw
__vq_raw = nil
redis = {}
redis.pcall = raw
redis.call = function(...)
  local r = raw(...)
  if type(r) == 'table' and r.err then error(r, 0) end
  return r
end
local function as_error(m)
  m = tostring(m)
  if string.sub(m, 1, 1) == '-' then m = string.sub(m, 2) end
  if not string.find(m, ' ', 1, true) then m = 'ERR ' .. m end
  return { err = m }
end
redis.error_reply = function(m) return as_error(m) end
redis.status_reply = function(m) return { ok = m } end
redis.log = function() end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
redis.setresp = function() end
__vq_fns, __vq_pending = {}, nil
redis.register_function = function(a, b)
  local name, fn = a, b
  if type(a) == 'table' then name, fn = a.function_name, a.callback end
  if type(name) ~= 'string' or type(fn) ~= 'function' then
    error('wrong arguments given to redis.register_function', 0)
  end
  if __vq_pending == nil then error('redis.register_function can only be called on FUNCTION LOAD command', 0) end
  if __vq_pending[name] or __vq_fns[name] then error('Function ' .. name .. ' already exists', 0) end
  __vq_pending[name] = fn
end
-- A script's own pcall gets a command's error as its message, as Redis 7.0's does (the
-- error table stays for a script that does not catch it).
local lua_pcall = pcall
local function caught(ok, ...)
  local e = ...
  if not ok and type(e) == 'table' and e.err then return false, e.err end
  return ok, ...
end
pcall = function(f, ...) return caught(lua_pcall(f, ...)) end
__vq_run = function(f, keys, argv)
  local ok, r = lua_pcall(f, keys, argv)
  if ok then return r end
  if type(r) == 'table' and r.err then return r end
  return { err = 'ERR ' .. tostring(r) }
end
"#;

/// The Lua state and the libraries loaded into it.
pub struct Host {
    lua: Lua,
    ks: Rc<RefCell<Keyspace>>,
    /// Each library's functions, by library name.
    libraries: HashMap<String, Vec<String>>,
}

impl Host {
    pub fn new(ks: Rc<RefCell<Keyspace>>) -> mlua::Result<Self> {
        let lua = Lua::new();
        let door = ks.clone();
        let raw = lua.create_function(move |lua, args: MultiValue| {
            let mut cmd = Vec::with_capacity(args.len());
            for v in args {
                match v {
                    Value::String(s) => cmd.push(s.as_bytes().to_vec()),
                    // Lua 5.1 has only doubles; Redis 7.0 writes them as `%.17g`.
                    Value::Integer(i) => cmd.push(g17(i as f64).into_bytes()),
                    Value::Number(n) => cmd.push(g17(n).into_bytes()),
                    _ => {
                        return to_lua(
                            lua,
                            Reply::err("ERR Lua redis lib command arguments must be strings or integers"),
                        );
                    }
                }
            }
            if cmd.is_empty() {
                return to_lua(lua, Reply::err("ERR Please specify at least one argument for this redis lib call"));
            }
            let reply = door.borrow_mut().exec(&cmd);
            to_lua(lua, reply)
        })?;
        lua.globals().set("__vq_raw", raw)?;
        lua.load(BOOT).set_name("@vq_embedded_boot").exec()?;
        Ok(Self { lua, ks, libraries: HashMap::new() })
    }

    /// `FUNCTION LOAD|FLUSH|DELETE …`.
    pub fn function(&mut self, a: &[Vec<u8>]) -> Reply {
        let sub = a.first().map(|s| String::from_utf8_lossy(s).to_ascii_uppercase()).unwrap_or_default();
        match (sub.as_str(), &a[1.min(a.len())..]) {
            ("LOAD", [code]) => self.load(code, false),
            ("LOAD", [r, code]) if r.eq_ignore_ascii_case(b"REPLACE") => self.load(code, true),
            ("FLUSH", _) => {
                let names: Vec<String> = self.libraries.keys().cloned().collect();
                for lib in names {
                    self.drop_library(&lib);
                }
                Reply::ok()
            }
            ("DELETE", [lib]) => {
                let lib = String::from_utf8_lossy(lib).into_owned();
                if self.libraries.contains_key(&lib) {
                    self.drop_library(&lib);
                    Reply::ok()
                } else {
                    Reply::err("ERR Library not found")
                }
            }
            _ => Reply::Error(format!("ERR unknown subcommand or wrong number of arguments for '{sub}'")),
        }
    }

    fn drop_library(&mut self, lib: &str) {
        if let (Some(fns), Ok(table)) = (self.libraries.remove(lib), self.lua.globals().get::<Table>("__vq_fns")) {
            for f in fns {
                let _ = table.set(f, Value::Nil);
            }
        }
    }

    fn load(&mut self, code: &[u8], replace: bool) -> Reply {
        let Some((header, body)) = code.split_at_checked(code.iter().position(|b| *b == b'\n').unwrap_or(code.len()))
        else {
            return Reply::err("ERR Missing library metadata");
        };
        let header = String::from_utf8_lossy(header);
        let Some(name) =
            header.strip_prefix("#!lua").and_then(|h| h.split_whitespace().find_map(|w| w.strip_prefix("name=")))
        else {
            return Reply::err("ERR Missing library metadata");
        };
        let name = name.to_owned();
        if self.libraries.contains_key(&name) {
            if !replace {
                return Reply::Error(format!("ERR Library '{name}' already exists"));
            }
            self.drop_library(&name);
        }
        match self.run_library(&name, body) {
            Ok(fns) => {
                self.libraries.insert(name.clone(), fns);
                Reply::Bulk(name.into_bytes())
            }
            Err(e) => Reply::Error(format!("ERR Error registering functions: {e}")),
        }
    }

    /// Runs a library's code (the header line left out, as a comment line so that line
    /// numbers hold) and moves the functions it registered into the callable ones.
    fn run_library(&self, name: &str, body: &[u8]) -> mlua::Result<Vec<String>> {
        let g = self.lua.globals();
        g.set("__vq_pending", self.lua.create_table()?)?;
        let mut code = b"--".to_vec();
        code.extend_from_slice(body);
        let ran = self.lua.load(code).set_name(format!("@{name}")).exec();
        let pending: Table = g.get("__vq_pending")?;
        g.set("__vq_pending", Value::Nil)?;
        ran?;
        let fns: Table = g.get("__vq_fns")?;
        let mut names = Vec::new();
        for pair in pending.pairs::<String, Function>() {
            let (n, f) = pair?;
            fns.set(n.as_str(), f)?;
            names.push(n);
        }
        if names.is_empty() {
            return Err(mlua::Error::runtime("No functions registered"));
        }
        Ok(names)
    }

    /// `FCALL name numkeys key… arg…`.
    pub fn fcall(&mut self, a: &[Vec<u8>]) -> Reply {
        let [name, numkeys, rest @ ..] = a else {
            return Reply::err("ERR wrong number of arguments for 'fcall' command");
        };
        let Some(n) = std::str::from_utf8(numkeys).ok().and_then(|s| s.parse::<usize>().ok()) else {
            return Reply::err("ERR Bad number of keys provided");
        };
        if n > rest.len() {
            return Reply::err("ERR Number of keys can't be greater than number of args");
        }
        let run = || -> mlua::Result<Reply> {
            let g = self.lua.globals();
            let f: Option<Function> = g.get::<Table>("__vq_fns")?.get(String::from_utf8_lossy(name).as_ref())?;
            let Some(f) = f else { return Ok(Reply::err("ERR Function not found")) };
            let keys = self.lua.create_sequence_from(
                rest[..n].iter().map(|k| self.lua.create_string(k)).collect::<mlua::Result<Vec<_>>>()?,
            )?;
            let argv = self.lua.create_sequence_from(
                rest[n..].iter().map(|k| self.lua.create_string(k)).collect::<mlua::Result<Vec<_>>>()?,
            )?;
            let runner: Function = g.get("__vq_run")?;
            let now = self.ks.borrow().now_ms();
            self.ks.borrow_mut().freeze_time(Some(now));
            let out = runner.call::<Value>((f, keys, argv));
            self.ks.borrow_mut().freeze_time(None);
            Ok(from_lua(&out?))
        };
        run().unwrap_or_else(|e| Reply::Error(format!("ERR {e}")))
    }
}

/// A reply as Redis hands it to a script.
fn to_lua(lua: &Lua, r: Reply) -> mlua::Result<Value> {
    Ok(match r {
        Reply::Nil => Value::Boolean(false),
        Reply::Int(i) => Value::Integer(i),
        Reply::Bulk(b) => Value::String(lua.create_string(b)?),
        Reply::Status(s) => Value::Table(lua.create_table_from([("ok", s)])?),
        Reply::Error(e) => Value::Table(lua.create_table_from([("err", e)])?),
        Reply::Array(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
    })
}

/// A script's answer as Redis replies it.
fn from_lua(v: &Value) -> Reply {
    match v {
        Value::Nil | Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::Integer(i) => Reply::Int(*i),
        Value::Number(n) => Reply::Int(*n as i64),
        Value::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        Value::Table(t) => {
            if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
                return Reply::Error(e.to_string_lossy());
            }
            if let Ok(Value::String(ok)) = t.raw_get::<Value>("ok") {
                return Reply::Status(ok.to_string_lossy());
            }
            let mut out = Vec::new();
            for i in 1.. {
                match t.raw_get::<Value>(i) {
                    Ok(Value::Nil) | Err(_) => break,
                    Ok(item) => out.push(from_lua(&item)),
                }
            }
            Reply::Array(out)
        }
        _ => Reply::Nil,
    }
}
