//! The keyspace's hashes, lists, sets and streams.

use super::args::{fmt_id, int, list_index, parse_int, rank_range, stream_edge};
use super::{Args, Fail, Keyspace, STREAM_NODE, arity, remove_field};
use crate::store::embedded::reply::{Reply, SYNTAX};

impl Keyspace {
    /// Hash, list, set and stream commands.
    pub(super) fn collection_command(&mut self, name: &str, a: Args) -> Result<Reply, Fail> {
        match name {
            // Hashes.
            "HSET" | "HMSET" => {
                if a.len() < 3 || a.len().is_multiple_of(2) {
                    return Err(Fail::Arity);
                }
                let h = self.hash_mut(&a[0])?;
                let mut added = 0;
                for pair in a[1..].chunks(2) {
                    if h.insert(pair[0].clone(), pair[1].clone()).is_none() {
                        added += 1;
                    }
                }
                Ok(if name == "HMSET" { Reply::ok() } else { Reply::Int(added) })
            }
            "HSETNX" => {
                arity(a, 3, 3)?;
                let h = self.hash_mut(&a[0])?;
                if h.contains_key(&a[1]) {
                    return Ok(Reply::Int(0));
                }
                h.insert(a[1].clone(), a[2].clone());
                Ok(Reply::Int(1))
            }
            "HGET" => {
                arity(a, 2, 2)?;
                Ok(self.hash(&a[0])?.and_then(|h| h.get(&a[1])).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())))
            }
            "HMGET" => {
                arity(a, 2, usize::MAX)?;
                let h = self.hash(&a[0])?;
                Ok(Reply::Array(
                    a[1..]
                        .iter()
                        .map(|f| h.and_then(|h| h.get(f)).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())))
                        .collect(),
                ))
            }
            "HGETALL" | "HKEYS" | "HVALS" => {
                arity(a, 1, 1)?;
                let Some(h) = self.hash(&a[0])? else { return Ok(Reply::Array(Vec::new())) };
                let mut out = Vec::new();
                for (k, v) in h {
                    if name != "HVALS" {
                        out.push(Reply::Bulk(k.clone()));
                    }
                    if name != "HKEYS" {
                        out.push(Reply::Bulk(v.clone()));
                    }
                }
                Ok(Reply::Array(out))
            }
            "HLEN" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(self.hash(&a[0])?.map_or(0, |h| h.len() as i64)))
            }
            "HEXISTS" => {
                arity(a, 2, 2)?;
                Ok(Reply::Int(self.hash(&a[0])?.is_some_and(|h| h.contains_key(&a[1])) as i64))
            }
            "HDEL" => {
                arity(a, 2, usize::MAX)?;
                if self.hash(&a[0])?.is_none() {
                    return Ok(Reply::Int(0));
                }
                let h = self.hash_mut(&a[0])?;
                let n = a[1..].iter().filter(|f| remove_field(h, f)).count();
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(n as i64))
            }
            "HINCRBY" => {
                arity(a, 3, 3)?;
                let by = int(&a[2])?;
                let h = self.hash_mut(&a[0])?;
                let current = match h.get(&a[1]) {
                    None => 0,
                    Some(v) => {
                        parse_int(v).ok_or_else(|| Fail::Reply(Reply::err("ERR hash value is not an integer")))?
                    }
                };
                let next = current
                    .checked_add(by)
                    .ok_or_else(|| Fail::Reply(Reply::err("ERR increment or decrement would overflow")))?;
                h.insert(a[1].clone(), next.to_string().into_bytes());
                Ok(Reply::Int(next))
            }
            // Lists.
            "LPUSH" | "RPUSH" => {
                arity(a, 2, usize::MAX)?;
                let l = self.list_mut(&a[0])?;
                for v in &a[1..] {
                    if name == "LPUSH" {
                        l.push_front(v.clone());
                    } else {
                        l.push_back(v.clone());
                    }
                }
                Ok(Reply::Int(l.len() as i64))
            }
            "LLEN" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(self.list(&a[0])?.map_or(0, |l| l.len() as i64)))
            }
            "LINDEX" => {
                arity(a, 2, 2)?;
                let i = int(&a[1])?;
                let Some(l) = self.list(&a[0])? else { return Ok(Reply::Nil) };
                Ok(list_index(i, l.len()).and_then(|i| l.get(i)).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())))
            }
            "LSET" => {
                arity(a, 3, 3)?;
                let i = int(&a[1])?;
                if self.list(&a[0])?.is_none() {
                    return Err(Fail::Reply(Reply::err("ERR no such key")));
                }
                let l = self.list_mut(&a[0])?;
                match list_index(i, l.len()) {
                    Some(i) if i < l.len() => {
                        l[i] = a[2].clone();
                        Ok(Reply::ok())
                    }
                    _ => Err(Fail::Reply(Reply::err("ERR index out of range"))),
                }
            }
            "LRANGE" => {
                arity(a, 3, 3)?;
                let (start, stop) = (int(&a[1])?, int(&a[2])?);
                let Some(l) = self.list(&a[0])? else { return Ok(Reply::Array(Vec::new())) };
                let Some((from, to)) = rank_range(start, stop, l.len()) else { return Ok(Reply::Array(Vec::new())) };
                Ok(Reply::bulks(l.iter().skip(from).take(to - from + 1).cloned()))
            }
            "LTRIM" => {
                arity(a, 3, 3)?;
                let (start, stop) = (int(&a[1])?, int(&a[2])?);
                if self.list(&a[0])?.is_none() {
                    return Ok(Reply::ok());
                }
                let l = self.list_mut(&a[0])?;
                match rank_range(start, stop, l.len()) {
                    Some((from, to)) => {
                        l.truncate(to + 1);
                        l.drain(..from);
                    }
                    None => l.clear(),
                }
                self.drop_if_empty(&a[0]);
                Ok(Reply::ok())
            }
            // Sets.
            "SADD" => {
                arity(a, 2, usize::MAX)?;
                let s = self.members_mut(&a[0])?;
                Ok(Reply::Int(a[1..].iter().filter(|m| s.insert((*m).clone())).count() as i64))
            }
            "SREM" => {
                arity(a, 2, usize::MAX)?;
                if self.members(&a[0])?.is_none() {
                    return Ok(Reply::Int(0));
                }
                let s = self.members_mut(&a[0])?;
                let n = a[1..].iter().filter(|m| s.remove(*m)).count();
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(n as i64))
            }
            "SMEMBERS" => {
                arity(a, 1, 1)?;
                Ok(Reply::bulks(
                    self.members(&a[0])?.map(|s| s.iter().cloned().collect::<Vec<_>>()).unwrap_or_default(),
                ))
            }
            "SISMEMBER" => {
                arity(a, 2, 2)?;
                Ok(Reply::Int(self.members(&a[0])?.is_some_and(|s| s.contains(&a[1])) as i64))
            }
            "SCARD" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(self.members(&a[0])?.map_or(0, |s| s.len() as i64)))
            }
            // Streams.
            "XADD" => self.xadd(a),
            "XRANGE" => self.xrange(a),
            "XLEN" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(self.stream(&a[0])?.map_or(0, |s| s.entries.len() as i64)))
            }
            _ => Err(Fail::Unknown),
        }
    }

    fn xadd(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 2, usize::MAX)?;
        let mut i = 1;
        let mut maxlen = None;
        if a[i].eq_ignore_ascii_case(b"MAXLEN") {
            i += 1;
            let approx = match a.get(i).map(Vec::as_slice) {
                Some(b"~") => true,
                Some(b"=") => false,
                _ => {
                    i -= 1;
                    false
                }
            };
            i += 1;
            let n = a.get(i).ok_or(Fail::Reply(Reply::err(SYNTAX)))?;
            let n = int(n)?;
            if n < 0 {
                return Err(Fail::Reply(Reply::err("ERR The MAXLEN argument must be >= 0.")));
            }
            maxlen = Some((n as usize, approx));
            i += 1;
        }
        let id = a.get(i).ok_or(Fail::Arity)?;
        let fields = &a[i + 1..];
        if fields.is_empty() || !fields.len().is_multiple_of(2) {
            return Err(Fail::Arity);
        }
        if id.as_slice() != b"*" {
            return Err(Fail::Reply(Reply::err("ERR the embedded store assigns stream ids itself ('*')")));
        }
        let now = self.now_ms();
        let s = self.stream_mut(&a[0])?;
        let next = if now > s.last.0 { (now, 0) } else { (s.last.0, s.last.1 + 1) };
        s.last = next;
        s.entries.push_back((next, fields.to_vec()));
        if let Some((max, approx)) = maxlen {
            // `~` trims whole nodes of a radix tree, as Redis does with its default of 100
            // entries per node: the oldest hundred at a time, while the rest stays at `max` or
            // more.
            let drop = if approx {
                (s.entries.len().saturating_sub(max) / STREAM_NODE) * STREAM_NODE
            } else {
                s.entries.len().saturating_sub(max)
            };
            s.entries.drain(..drop);
        }
        Ok(Reply::Bulk(fmt_id(next)))
    }

    fn xrange(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 3, 5)?;
        let lo = stream_edge(&a[1], false)?;
        let hi = stream_edge(&a[2], true)?;
        let count = match &a[3..] {
            [] => usize::MAX,
            [c, n] if c.eq_ignore_ascii_case(b"COUNT") => usize::try_from(int(n)?).unwrap_or(0),
            _ => return Err(Fail::Reply(Reply::err(SYNTAX))),
        };
        let Some(s) = self.stream(&a[0])? else { return Ok(Reply::Array(Vec::new())) };
        let out = s
            .entries
            .iter()
            .filter(|(id, _)| lo.is_some_and(|lo| *id >= lo) && hi.is_some_and(|hi| *id <= hi))
            .take(count)
            .map(|(id, f)| Reply::Array(vec![Reply::Bulk(fmt_id(*id)), Reply::bulks(f.iter().cloned())]))
            .collect();
        Ok(Reply::Array(out))
    }
}
