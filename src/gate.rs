//! Which requests the gate guards: a request path canonicalised once ([`CanonicalPath`]), and a
//! table of routes compiled once from `gate.routes` that matches it. Pure.
//!
//! The gate must decide on what the purchase API will see, so a path is gated whenever a
//! common upstream (Spring, Tomcat, Express, nginx) could route it to a gated route:
//! unreserved percent-escapes are decoded, dot segments resolved, repeated slashes collapsed,
//! and segments match a route's literals case-insensitively, without a trailing slash, without
//! `;matrix` parameters, surrounding whitespace, or a `.suffix` (`orders.json`). Spellings
//! that upstreams read differently from one another (an encoded `/`, `\` or control character,
//! a `#` raw or encoded (`%23`), a leading `//` (a host name to URL parsers), an encoded or
//! parameterised dot segment, `..` above the root, invalid UTF-8) are refused
//! with [`PathError`] instead of guessed at. Every method is gated: a route's `method` says what
//! the upstream takes, and any other method on that path needs a token too.

use std::sync::Arc;

use crate::domain::{ParseError, QueueTarget, QueueTargetType};

/// Why a request path is refused instead of matched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path must start with /")]
    NotAbsolute,
    #[error("the path starts with //, which servers read as a host name: send it with one /")]
    NetworkPath,
    #[error("the path holds a malformed percent-escape")]
    BadEscape,
    #[error("the path holds an encoded {0}, which servers read differently: send the path without it")]
    EncodedDelimiter(&'static str),
    #[error("the path holds a {0}, which servers read differently: send the path without it")]
    RawCharacter(&'static str),
    #[error("the path holds an encoded or parameterised dot segment, which servers read differently")]
    DisguisedDotSegment,
    #[error("the path climbs above the root with `..`")]
    AboveRoot,
    #[error("the path is not UTF-8 once decoded")]
    NotUtf8,
}

/// Why a configured route (`gate.routes`) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error(transparent)]
    Target(#[from] ParseError),
    #[error("path `{path}` must start with /")]
    NotAbsolute { path: String },
    #[error("path `{path}`: segment `{segment}` must be letters, digits, - _ ~")]
    BadSegment { path: String, segment: String },
    #[error("path `{path}` needs exactly one {{id}} segment")]
    NotOneId { path: String },
}

/// A request path in the one form the gate matches and forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalPath {
    /// Dot segments resolved, repeated slashes collapsed, unreserved escapes decoded, other
    /// escapes in upper case; a trailing slash kept. What the gate sends upstream, so the
    /// purchase API never sees a spelling the gate did not check.
    forwarded: String,
    /// The segments of `forwarded`, fully decoded, for matching.
    segments: Vec<String>,
}

impl CanonicalPath {
    /// Canonicalises the path of a request (no query string).
    pub fn parse(raw: &str) -> Result<Self, PathError> {
        let rest = raw.strip_prefix('/').ok_or(PathError::NotAbsolute)?;
        if rest.starts_with('/') {
            return Err(PathError::NetworkPath);
        }
        let mut kept: Vec<(String, String)> = Vec::new();
        let mut directory = false;
        for seg in rest.split('/') {
            let (forwarded, decoded, escaped_dot) = decode_segment(seg)?;
            let bare = bare_segment(&decoded);
            if matches!(bare, "." | "..") && (escaped_dot || bare != decoded) {
                return Err(PathError::DisguisedDotSegment);
            }
            directory = true;
            match forwarded.as_str() {
                "" | "." => {}
                ".." => {
                    kept.pop().ok_or(PathError::AboveRoot)?;
                }
                _ => {
                    directory = false;
                    kept.push((forwarded, decoded));
                }
            }
        }
        let mut path = String::with_capacity(raw.len());
        for (f, _) in &kept {
            path.push('/');
            path.push_str(f);
        }
        if kept.is_empty() || directory {
            path.push('/');
        }
        Ok(Self { forwarded: path, segments: kept.into_iter().map(|(_, d)| d).collect() })
    }

    /// The path to forward upstream.
    pub fn as_str(&self) -> &str {
        &self.forwarded
    }

    /// Whether the path is in vq's own namespace (`/virtual-queues/…`), however spelt.
    pub fn is_queue_api(&self) -> bool {
        self.segments.first().is_some_and(|s| literal_matches(bare_segment(s), "virtual-queues"))
    }
}

/// `(forwarded, decoded, had an escaped dot)` of one raw segment.
fn decode_segment(seg: &str) -> Result<(String, String, bool), PathError> {
    let raw = seg.as_bytes();
    let mut forwarded = Vec::with_capacity(raw.len());
    let mut decoded = Vec::with_capacity(raw.len());
    let mut escaped_dot = false;
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        match b {
            b'%' => {
                let hex = raw.get(i + 1..i + 3).ok_or(PathError::BadEscape)?;
                let hex = std::str::from_utf8(hex).map_err(|_| PathError::BadEscape)?;
                let v = u8::from_str_radix(hex, 16).map_err(|_| PathError::BadEscape)?;
                match v {
                    b'/' => return Err(PathError::EncodedDelimiter("slash (%2F)")),
                    b'\\' => return Err(PathError::EncodedDelimiter("backslash (%5C)")),
                    b'#' => return Err(PathError::EncodedDelimiter("# (%23)")),
                    0 => return Err(PathError::EncodedDelimiter("NUL (%00)")),
                    v if v < 0x20 || v == 0x7f => return Err(PathError::EncodedDelimiter("control character")),
                    v if v.is_ascii_alphanumeric() || matches!(v, b'-' | b'.' | b'_' | b'~') => {
                        escaped_dot |= v == b'.';
                        forwarded.push(v);
                    }
                    v => forwarded.extend_from_slice(format!("%{v:02X}").as_bytes()),
                }
                decoded.push(v);
                i += 3;
                continue;
            }
            b'\\' => return Err(PathError::RawCharacter("backslash")),
            b'#' => return Err(PathError::RawCharacter("#")),
            b if b < 0x20 || b == 0x7f => return Err(PathError::RawCharacter("control character")),
            b => {
                forwarded.push(b);
                decoded.push(b);
            }
        }
        i += 1;
    }
    let forwarded = String::from_utf8(forwarded).map_err(|_| PathError::NotUtf8)?;
    let decoded = String::from_utf8(decoded).map_err(|_| PathError::NotUtf8)?;
    Ok((forwarded, decoded, escaped_dot))
}

/// A decoded segment as a lenient router sees it: no `;params`, no surrounding whitespace.
fn bare_segment(decoded: &str) -> &str {
    decoded.split(';').next().unwrap_or("").trim()
}

/// Whether `seg` (bare) names the ASCII `literal` for a case-insensitive router, alone or with
/// a `.suffix`. Non-ASCII letters that some routers fold to an ASCII one (`ſ` → `S`, Kelvin
/// sign → `k`) count as that letter.
fn literal_matches(seg: &str, literal: &str) -> bool {
    let mut chars = seg.chars();
    for l in literal.chars() {
        let Some(c) = chars.next() else { return false };
        let same = c.eq_ignore_ascii_case(&l)
            || (!c.is_ascii()
                && (c.to_lowercase().any(|x| x.eq_ignore_ascii_case(&l))
                    || c.to_uppercase().any(|x| x.eq_ignore_ascii_case(&l))));
        if !same {
            return false;
        }
    }
    matches!(chars.next(), None | Some('.'))
}

/// One gated route as configured (`gate.routes`): `POST /limited-drops/{id}/orders` → target
/// `LIMITED_DROP:{id}`. [`GateRoutes::compile`] checks and compiles a table of them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateRoute {
    pub method: String,
    /// Path with exactly one `{…}` segment holding the target id.
    pub path: String,
    /// `LIMITED_DROP` or `TICKETING_EVENT` (slugs accepted).
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Id,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Compiled {
    /// The path as configured, e.g. `/limited-drops/{dropId}/orders`: the metrics label.
    template: Arc<str>,
    segments: Vec<Segment>,
    kind: QueueTargetType,
}

/// The gated routes, matched against a request's canonical path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateRoutes(Vec<Compiled>);

impl GateRoutes {
    pub fn compile(routes: &[GateRoute]) -> Result<Self, RouteError> {
        let mut out = Vec::with_capacity(routes.len());
        for r in routes {
            let kind = QueueTargetType::parse_any(&r.target)?;
            if !r.path.starts_with('/') {
                return Err(RouteError::NotAbsolute { path: r.path.clone() });
            }
            let mut segments = Vec::new();
            for s in r.path.trim_start_matches('/').split('/') {
                if s.starts_with('{') && s.ends_with('}') {
                    segments.push(Segment::Id);
                } else if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_~".contains(&b)) {
                    segments.push(Segment::Literal(s.to_owned()));
                } else {
                    return Err(RouteError::BadSegment { path: r.path.clone(), segment: s.to_owned() });
                }
            }
            if segments.iter().filter(|s| **s == Segment::Id).count() != 1 {
                return Err(RouteError::NotOneId { path: r.path.clone() });
            }
            out.push(Compiled { template: r.path.as_str().into(), segments, kind });
        }
        Ok(Self(out))
    }

    /// `None` when the path is not gated; otherwise the target, or why its id is invalid.
    /// Every method is gated.
    pub fn match_path(&self, path: &CanonicalPath) -> Option<Result<QueueTarget, ParseError>> {
        let (route, id) = self.find(path)?;
        Some(QueueTarget::from_parts(route.kind.as_str(), id))
    }

    /// The path of the first gated route of `target`'s type, its id filled in: where a buyer
    /// of `target` purchases (`vq loadgen`).
    pub fn path_of(&self, target: QueueTarget) -> Option<String> {
        let route = self.0.iter().find(|r| r.kind == target.kind)?;
        let parts: Vec<String> = route
            .segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => l.clone(),
                Segment::Id => target.id.to_string(),
            })
            .collect();
        Some(format!("/{}", parts.join("/")))
    }

    /// The configured path of the gated route `path` matches, e.g.
    /// `/limited-drops/{dropId}/orders`: what metrics label it by, never the raw path.
    pub fn template(&self, path: &CanonicalPath) -> Option<&Arc<str>> {
        self.find(path).map(|(route, _)| &route.template)
    }

    /// The route `path` matches and the id segment as sent.
    fn find<'p>(&self, path: &'p CanonicalPath) -> Option<(&Compiled, &'p str)> {
        let parts: Vec<&str> = path.segments.iter().map(|s| bare_segment(s)).collect();
        self.0.iter().find_map(|route| {
            if route.segments.len() != parts.len() {
                return None;
            }
            let mut id = None;
            for (seg, part) in route.segments.iter().zip(&parts) {
                match seg {
                    Segment::Literal(l) if literal_matches(part, l) => {}
                    Segment::Literal(_) => return None,
                    Segment::Id => id = Some(*part),
                }
            }
            Some((route, id?))
        })
    }
}

#[cfg(test)]
mod tests;
