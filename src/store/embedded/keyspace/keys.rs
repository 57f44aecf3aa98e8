//! The keyspace's commands on any key (expiry, existence, renaming), the server's own (`PING`,
//! `TIME`) and strings.

use super::args::int;
use super::{Args, Data, Entry, Fail, Keyspace, arity, wrongtype};
use crate::store::embedded::reply::{NOT_INTEGER, Reply, SYNTAX};

impl Keyspace {
    /// Server, generic key and string commands.
    pub(super) fn key_command(&mut self, name: &str, a: Args) -> Result<Reply, Fail> {
        match name {
            // Server.
            "PING" => Ok(match a {
                [] => Reply::Status("PONG".into()),
                [m] => Reply::Bulk(m.clone()),
                _ => return Err(Fail::Arity),
            }),
            "TIME" => {
                arity(a, 0, 0)?;
                let now = self.now_ms();
                Ok(Reply::bulks([
                    (now / 1000).to_string().into_bytes(),
                    ((now % 1000) * 1000).to_string().into_bytes(),
                ]))
            }
            "DBSIZE" => Ok(Reply::Int(self.len() as i64)),
            "FLUSHALL" | "FLUSHDB" => {
                self.keys.clear();
                Ok(Reply::ok())
            }
            // Generic keys.
            "DEL" | "UNLINK" => {
                arity(a, 1, usize::MAX)?;
                let mut n = 0;
                for k in a {
                    if self.exists(k) {
                        self.keys.remove(k);
                        n += 1;
                    }
                }
                Ok(Reply::Int(n))
            }
            "EXISTS" => {
                arity(a, 1, usize::MAX)?;
                Ok(Reply::Int(a.iter().filter(|k| self.exists(k)).count() as i64))
            }
            "TYPE" => {
                arity(a, 1, 1)?;
                let t = match self.live(&a[0]).map(|e| &e.data) {
                    None => "none",
                    Some(Data::Str(_)) => "string",
                    Some(Data::Hash(_)) => "hash",
                    Some(Data::ZSet(_)) => "zset",
                    Some(Data::List(_)) => "list",
                    Some(Data::Set(_)) => "set",
                    Some(Data::Stream(_)) => "stream",
                };
                Ok(Reply::Status(t.into()))
            }
            "EXPIRE" | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT" => self.expire(name, a),
            "TTL" | "PTTL" | "EXPIRETIME" | "PEXPIRETIME" => {
                arity(a, 1, 1)?;
                let now = self.now_ms();
                let Some(e) = self.live(&a[0]) else { return Ok(Reply::Int(-2)) };
                let Some(at) = e.expires_at else { return Ok(Reply::Int(-1)) };
                let left = at.saturating_sub(now) as i64;
                Ok(Reply::Int(match name {
                    "TTL" => (left + 500) / 1000,
                    "PTTL" => left,
                    "EXPIRETIME" => (at / 1000) as i64,
                    _ => at as i64,
                }))
            }
            "PERSIST" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(match self.live(&a[0]) {
                    Some(e) if e.expires_at.is_some() => {
                        e.expires_at = None;
                        1
                    }
                    _ => 0,
                }))
            }
            "RENAME" => {
                arity(a, 2, 2)?;
                if !self.exists(&a[0]) {
                    return Err(Fail::Reply(Reply::err("ERR no such key")));
                }
                let e = self.keys.remove(&a[0]).expect("checked above");
                self.keys.insert(a[1].clone(), e);
                Ok(Reply::ok())
            }
            // Strings.
            "GET" => {
                arity(a, 1, 1)?;
                Ok(match self.live(&a[0]) {
                    None => Reply::Nil,
                    Some(Entry { data: Data::Str(s), .. }) => Reply::Bulk(s.clone()),
                    Some(_) => return Err(wrongtype()),
                })
            }
            "MGET" => {
                arity(a, 1, usize::MAX)?;
                let mut out = Vec::with_capacity(a.len());
                for k in a {
                    out.push(match self.live(k) {
                        Some(Entry { data: Data::Str(s), .. }) => Reply::Bulk(s.clone()),
                        _ => Reply::Nil,
                    });
                }
                Ok(Reply::Array(out))
            }
            "SET" => self.set_string(a),
            "GETRANGE" => {
                arity(a, 3, 3)?;
                let (start, end) = (int(&a[1])?, int(&a[2])?);
                let s = match self.live(&a[0]) {
                    None => return Ok(Reply::Bulk(Vec::new())),
                    Some(Entry { data: Data::Str(s), .. }) => s,
                    Some(_) => return Err(wrongtype()),
                };
                Ok(Reply::Bulk(byte_range(s, start, end).to_vec()))
            }
            "BITFIELD" => self.bitfield(a),
            "SETRANGE" => self.set_range(a),
            "SETEX" | "PSETEX" => {
                arity(a, 3, 3)?;
                let t = int(&a[1])?;
                if t <= 0 {
                    return Err(Fail::Reply(Reply::Error(format!(
                        "ERR invalid expire time in '{}' command",
                        name.to_lowercase()
                    ))));
                }
                let ms = if name == "SETEX" { t.saturating_mul(1000) } else { t } as u64;
                let at = self.now_ms().saturating_add(ms);
                self.keys.insert(a[0].clone(), Entry { data: Data::Str(a[2].clone()), expires_at: Some(at) });
                Ok(Reply::ok())
            }
            "INCR" | "DECR" | "INCRBY" | "DECRBY" => {
                let by = match name {
                    "INCR" => {
                        arity(a, 1, 1)?;
                        1
                    }
                    "DECR" => {
                        arity(a, 1, 1)?;
                        -1
                    }
                    "INCRBY" => {
                        arity(a, 2, 2)?;
                        int(&a[1])?
                    }
                    _ => {
                        arity(a, 2, 2)?;
                        int(&a[1])?.checked_neg().ok_or_else(|| Fail::Reply(Reply::err(NOT_INTEGER)))?
                    }
                };
                let current = match self.live(&a[0]) {
                    None => 0,
                    Some(Entry { data: Data::Str(s), .. }) => int(s)?,
                    Some(_) => return Err(wrongtype()),
                };
                let next = current
                    .checked_add(by)
                    .ok_or_else(|| Fail::Reply(Reply::err("ERR increment or decrement would overflow")))?;
                let bytes = next.to_string().into_bytes();
                match self.live(&a[0]) {
                    Some(e) => e.data = Data::Str(bytes),
                    None => {
                        self.keys.insert(a[0].clone(), Entry { data: Data::Str(bytes), expires_at: None });
                    }
                }
                Ok(Reply::Int(next))
            }
            _ => Err(Fail::Unknown),
        }
    }

    /// `SETRANGE key offset value`: overwrites the string from byte `offset`, padding with zero
    /// bytes up to it; the new length. An empty value changes nothing (and creates no key).
    /// What `enter.lua` writes a run of new users' heartbeats with.
    fn set_range(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 3, 3)?;
        let offset = int(&a[1])?;
        let offset = usize::try_from(offset).map_err(|_| Fail::Reply(Reply::err("ERR offset is out of range")))?;
        let value = &a[2];
        if offset.saturating_add(value.len()) > 512 * 1024 * 1024 {
            return Err(Fail::Reply(Reply::err("ERR string exceeds maximum allowed size (proto-max-bulk-len)")));
        }
        match self.live(&a[0]) {
            Some(Entry { data: Data::Str(_), .. }) => {}
            Some(_) => return Err(wrongtype()),
            None if value.is_empty() => return Ok(Reply::Int(0)),
            None => {
                self.keys.insert(a[0].clone(), Entry { data: Data::Str(Vec::new()), expires_at: None });
            }
        }
        let Some(Entry { data: Data::Str(e), .. }) = self.live(&a[0]) else { return Err(wrongtype()) };
        if !value.is_empty() {
            let end = offset + value.len();
            if e.len() < end {
                e.resize(end, 0);
            }
            e[offset..end].copy_from_slice(value);
        }
        Ok(Reply::Int(e.len() as i64))
    }

    /// `BITFIELD key [GET type offset] [SET type offset value] ...` with unsigned types
    /// (`u1`..`u63`) and offsets in bits or, with `#`, in multiples of the type's width: what
    /// vq's scripts send (the waiting users' heartbeats). Bits count from the most significant
    /// bit of the first byte; a SET past the end grows the string with zero bytes and answers
    /// the old value; a GET past the end reads zeros.
    fn bitfield(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 1, usize::MAX)?;
        let mut ops = Vec::new();
        let mut rest = &a[1..];
        while let Some(op) = rest.first() {
            let op = String::from_utf8_lossy(op).to_ascii_uppercase();
            let n = match op.as_str() {
                "GET" => 3,
                "SET" => 4,
                _ => return Err(Fail::Reply(Reply::err(SYNTAX))),
            };
            if rest.len() < n {
                return Err(Fail::Reply(Reply::err(SYNTAX)));
            }
            let bits = match rest[1].split_first() {
                Some((b'u', w)) => {
                    std::str::from_utf8(w).ok().and_then(|w| w.parse::<u32>().ok()).filter(|w| (1..=63).contains(w))
                }
                _ => None,
            }
            .ok_or_else(|| {
                Fail::Reply(Reply::err(
                    "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.",
                ))
            })?;
            let offset = match rest[2].strip_prefix(b"#") {
                Some(k) => int(k).ok().filter(|k| *k >= 0).map(|k| k as u64 * u64::from(bits)),
                None => int(&rest[2]).ok().filter(|k| *k >= 0).map(|k| k as u64),
            }
            .ok_or_else(|| Fail::Reply(Reply::err("ERR bit offset is not an integer or out of range")))?;
            let value = if n == 4 { Some(int(&rest[3])?) } else { None };
            ops.push((bits, offset, value));
            rest = &rest[n..];
        }
        let s = match self.live(&a[0]) {
            None => None,
            Some(Entry { data: Data::Str(s), .. }) => Some(s.clone()),
            Some(_) => return Err(wrongtype()),
        };
        let mut bytes = s.clone().unwrap_or_default();
        let mut out = Vec::with_capacity(ops.len());
        for (bits, offset, value) in ops {
            let read = |b: &[u8]| -> u64 {
                (0..u64::from(bits)).fold(0, |acc, i| {
                    let at = offset + i;
                    let byte = b.get((at / 8) as usize).copied().unwrap_or(0);
                    (acc << 1) | u64::from((byte >> (7 - at % 8)) & 1)
                })
            };
            let old = read(&bytes);
            if let Some(v) = value {
                let v = (v as u64) & ((1u64 << bits) - 1);
                let end = ((offset + u64::from(bits)).div_ceil(8)) as usize;
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                for i in 0..u64::from(bits) {
                    let at = offset + i;
                    let bit = (v >> (u64::from(bits) - 1 - i)) & 1;
                    let mask = 1u8 << (7 - at % 8);
                    let byte = &mut bytes[(at / 8) as usize];
                    *byte = if bit == 1 { *byte | mask } else { *byte & !mask };
                }
            }
            out.push(Reply::Int(old as i64));
        }
        if s.as_ref() != Some(&bytes) && (s.is_some() || !bytes.is_empty()) {
            match self.live(&a[0]) {
                Some(e) => e.data = Data::Str(bytes),
                None => {
                    self.keys.insert(a[0].clone(), Entry { data: Data::Str(bytes), expires_at: None });
                }
            }
        }
        Ok(Reply::Array(out))
    }

    fn expire(&mut self, name: &str, a: Args) -> Result<Reply, Fail> {
        arity(a, 2, 3)?;
        let t = int(&a[1])?;
        let now = self.now_ms() as i64;
        let at = match name {
            "EXPIRE" => now.saturating_add(t.saturating_mul(1000)),
            "PEXPIRE" => now.saturating_add(t),
            "EXPIREAT" => t.saturating_mul(1000),
            _ => t,
        };
        let opt = a.get(2).map(|o| String::from_utf8_lossy(o).to_ascii_uppercase());
        let Some(e) = self.live(&a[0]) else { return Ok(Reply::Int(0)) };
        let current = e.expires_at.map(|c| c as i64);
        let allowed = match opt.as_deref() {
            None => true,
            Some("NX") => current.is_none(),
            Some("XX") => current.is_some(),
            // No expiry counts as an infinite one.
            Some("GT") => current.is_some_and(|c| at > c),
            Some("LT") => current.is_none_or(|c| at < c),
            Some(o) => return Err(Fail::Reply(Reply::Error(format!("ERR Unsupported option {o}")))),
        };
        if !allowed {
            return Ok(Reply::Int(0));
        }
        if at <= now {
            self.keys.remove(&a[0]);
        } else {
            e.expires_at = Some(at as u64);
        }
        Ok(Reply::Int(1))
    }

    fn set_string(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 2, usize::MAX)?;
        let now = self.now_ms();
        let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
        let mut expires_at = None;
        let mut i = 2;
        while i < a.len() {
            let opt = String::from_utf8_lossy(&a[i]).to_ascii_uppercase();
            match opt.as_str() {
                "NX" => nx = true,
                "XX" => xx = true,
                "GET" => get = true,
                "KEEPTTL" => keepttl = true,
                "EX" | "PX" | "EXAT" | "PXAT" => {
                    let Some(v) = a.get(i + 1) else { return Err(Fail::Reply(Reply::err(SYNTAX))) };
                    if expires_at.is_some() {
                        return Err(Fail::Reply(Reply::err(SYNTAX)));
                    }
                    let t = int(v)?;
                    if t <= 0 {
                        return Err(Fail::Reply(Reply::err("ERR invalid expire time in 'set' command")));
                    }
                    let t = t as u64;
                    expires_at = Some(match opt.as_str() {
                        "EX" => now.saturating_add(t.saturating_mul(1000)),
                        "PX" => now.saturating_add(t),
                        "EXAT" => t.saturating_mul(1000),
                        _ => t,
                    });
                    i += 1;
                }
                _ => return Err(Fail::Reply(Reply::err(SYNTAX))),
            }
            i += 1;
        }
        if (nx && xx) || (keepttl && expires_at.is_some()) {
            return Err(Fail::Reply(Reply::err(SYNTAX)));
        }
        let old = match self.live(&a[0]) {
            None => None,
            Some(Entry { data: Data::Str(s), expires_at }) => Some((Some(s.clone()), *expires_at)),
            Some(e) if get => {
                let _ = e;
                return Err(wrongtype());
            }
            Some(e) => Some((None, e.expires_at)),
        };
        let previous =
            if get { old.as_ref().and_then(|(v, _)| v.clone()).map_or(Reply::Nil, Reply::Bulk) } else { Reply::ok() };
        if (nx && old.is_some()) || (xx && old.is_none()) {
            return Ok(if get { previous } else { Reply::Nil });
        }
        let ttl = if keepttl { old.and_then(|(_, t)| t) } else { expires_at };
        if ttl.is_some_and(|at| at <= now) {
            self.keys.remove(&a[0]);
        } else {
            self.keys.insert(a[0].clone(), Entry { data: Data::Str(a[1].clone()), expires_at: ttl });
        }
        Ok(previous)
    }
}

/// The bytes of `s` from `start` to `end` inclusive, counted from the end when negative, as
/// GETRANGE answers them.
fn byte_range(s: &[u8], start: i64, end: i64) -> &[u8] {
    let len = s.len() as i64;
    if len == 0 || (start < 0 && end < 0 && start > end) {
        return &[];
    }
    let start = if start < 0 { (len + start).max(0) } else { start };
    let end = if end < 0 { (len + end).max(0) } else { end.min(len - 1) };
    if start > end || start >= len {
        return &[];
    }
    &s[start as usize..=end as usize]
}
