//! Reading a command's arguments (integers, scores, ranges, stream ids) and writing numbers,
//! as Redis 7.0 does.

use super::zset::{Edge, Score};
use super::{Args, Fail, StreamId};
use crate::store::embedded::reply::{NOT_FLOAT, NOT_INTEGER, Reply, SYNTAX};

pub(super) fn parse_int(b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?;
    // Redis takes no sign `+`, no spaces, no leading zeros.
    if s.is_empty() || s.starts_with('+') || (s.len() > 1 && s.starts_with('0')) || s.starts_with("-0") {
        return None;
    }
    s.parse().ok()
}

pub(super) fn int(b: &[u8]) -> Result<i64, Fail> {
    parse_int(b).ok_or_else(|| Fail::Reply(Reply::err(NOT_INTEGER)))
}

pub(super) fn parse_float(b: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(b).ok()?;
    let v = match s.to_ascii_lowercase().as_str() {
        "inf" | "+inf" | "infinity" | "+infinity" => f64::INFINITY,
        "-inf" | "-infinity" => f64::NEG_INFINITY,
        t if t.contains("nan") || t.is_empty() || t.trim() != t => return None,
        t => t.parse().ok()?,
    };
    Some(v)
}

pub(super) fn score(b: &[u8]) -> Result<f64, Fail> {
    parse_float(b).ok_or_else(|| Fail::Reply(Reply::err(NOT_FLOAT)))
}

pub(super) fn edge(b: &[u8]) -> Result<Edge, Fail> {
    let (exclusive, rest) = match b.first() {
        Some(b'(') => (true, &b[1..]),
        _ => (false, b),
    };
    let value = parse_float(rest).ok_or_else(|| Fail::Reply(Reply::err("ERR min or max is not a float")))?;
    Ok(Edge { value, exclusive })
}

/// `WITHSCORES` and `LIMIT offset count` after a score range.
pub(super) fn range_options(a: Args) -> Result<(bool, usize, usize), Fail> {
    let (mut withscores, mut offset, mut count) = (false, 0, usize::MAX);
    let mut i = 0;
    while i < a.len() {
        if a[i].eq_ignore_ascii_case(b"WITHSCORES") {
            withscores = true;
            i += 1;
        } else if a[i].eq_ignore_ascii_case(b"LIMIT") && a.len() >= i + 3 {
            let (o, c) = (int(&a[i + 1])?, int(&a[i + 2])?);
            if o < 0 {
                return Ok((withscores, usize::MAX, 0));
            }
            offset = o as usize;
            count = if c < 0 { usize::MAX } else { c as usize };
            i += 3;
        } else {
            return Err(Fail::Reply(Reply::err(SYNTAX)));
        }
    }
    Ok((withscores, offset, count))
}

pub(super) fn scored<'a>(items: impl Iterator<Item = &'a (Score, Vec<u8>)>, withscores: bool) -> Reply {
    let mut out = Vec::new();
    for (s, m) in items {
        out.push(Reply::Bulk(m.clone()));
        if withscores {
            out.push(Reply::Bulk(fmt_score(s.0)));
        }
    }
    Reply::Array(out)
}

/// `start..=stop` (negative from the end) clamped to a sequence of `len`; `None` if empty.
pub(super) fn rank_range(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let start = if start < 0 { (len + start).max(0) } else { start };
    let stop = if stop < 0 { len + stop } else { stop.min(len - 1) };
    if start > stop || start >= len || stop < 0 { None } else { Some((start as usize, stop as usize)) }
}

pub(super) fn list_index(i: i64, len: usize) -> Option<usize> {
    let i = if i < 0 { len as i64 + i } else { i };
    usize::try_from(i).ok()
}

/// A score as Redis 7.0 writes it: an integer below 2^52 in digits, anything else as C's
/// `%.17g` (`1.5`, `1e+20`, `inf`).
pub fn fmt_score(s: f64) -> Vec<u8> {
    if s.fract() == 0.0 && s.abs() < 4_503_599_627_370_496.0 {
        return format!("{}", s as i64).into_bytes();
    }
    g17(s).into_bytes()
}

/// C's `printf("%.17g", v)`: 17 significant digits, trailing zeros dropped, an exponent
/// (`e+20`, `e-05`) below 1e-4 or from 1e17 on. Redis 7.0 writes numbers so (scores, and a
/// script's number sent as a command's argument).
pub fn g17(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let sci = format!("{v:.16e}");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("a number");
    let trim = |m: &str| -> String {
        if m.contains('.') { m.trim_end_matches('0').trim_end_matches('.').to_owned() } else { m.to_owned() }
    };
    if !(-4..17).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{}e{sign}{:02}", trim(mantissa), exp.abs());
    }
    let decimals = usize::try_from(16 - exp).unwrap_or(0);
    trim(&format!("{v:.decimals$}"))
}

pub(super) fn fmt_id((ms, seq): StreamId) -> Vec<u8> {
    format!("{ms}-{seq}").into_bytes()
}

/// A stream range's end: `-`, `+`, `ms`, `ms-seq`, each start exclusive after `(`. `None`: a
/// range that holds nothing (`(` past the largest id).
pub(super) fn stream_edge(b: &[u8], upper: bool) -> Result<Option<StreamId>, Fail> {
    let bad = || Fail::Reply(Reply::err("ERR Invalid stream ID specified as stream command argument"));
    match b {
        b"-" => return Ok(Some((0, 0))),
        b"+" => return Ok(Some((u64::MAX, u64::MAX))),
        _ => {}
    }
    let (exclusive, rest) = match b.first() {
        Some(b'(') => (true, &b[1..]),
        _ => (false, b),
    };
    let s = std::str::from_utf8(rest).map_err(|_| bad())?;
    let id = match s.split_once('-') {
        Some((ms, seq)) => (ms.parse().map_err(|_| bad())?, seq.parse().map_err(|_| bad())?),
        None => (s.parse().map_err(|_| bad())?, if upper { u64::MAX } else { 0 }),
    };
    if !exclusive {
        return Ok(Some(id));
    }
    Ok(if upper {
        if id == (0, 0) {
            None
        } else if id.1 == 0 {
            Some((id.0 - 1, u64::MAX))
        } else {
            Some((id.0, id.1 - 1))
        }
    } else if id.1 == u64::MAX {
        if id.0 == u64::MAX { None } else { Some((id.0 + 1, 0)) }
    } else {
        Some((id.0, id.1 + 1))
    })
}
