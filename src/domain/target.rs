//! Queue targets (`LIMITED_DROP:42`) and user ids, parsed once at the edge.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::Shard;

/// Why a target, type or user id could not be parsed; the text is shown to API callers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error(
        "`{0}` is not a target type: expected a slug such as limited-drop (lower-case letters and digits, \
         words joined by `-`, at most {MAX_TYPE_LEN} characters) or its name, LIMITED_DROP"
    )]
    BadType(String),
    #[error("`{0}` is not a positive 64-bit integer id")]
    BadId(String),
    #[error("`{0}` is not a target: expected TYPE:ID, e.g. limited-drop:42")]
    BadTarget(String),
    #[error("`{0}` is not a range of targets: expected TYPE:FIRST-LAST, e.g. limited-drop:1000-1999")]
    BadRange(String),
    #[error("{0} is not a user id: {USER_ID_RULE}")]
    BadUser(String),
}

/// The longest user id vq takes, in characters (each one byte: the set is ASCII).
pub const MAX_USER_ID_LEN: usize = 128;

/// What a user id is, as API callers are told.
pub const USER_ID_RULE: &str = "expected 1 to 128 characters, each a letter, a digit or one of - _ . : @ +";

/// Whether `b` may appear in a user id: none of the others can be mistaken for a separator
/// anywhere a user id is written (`|` in the token payload, `{`/`}` in Redis Cluster hash
/// tags, `,` and whitespace in lists, `%`/`/` in URLs and file names).
pub fn is_user_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@' | b'+')
}

/// The longest type slug (and name) vq takes.
pub const MAX_TYPE_LEN: usize = 32;

/// The kind of sale a queue protects, named by the operator (`[[targets.types]]`): written
/// `limited-drop` in URLs and `LIMITED_DROP` in Redis keys, tokens and logs, the one spelt
/// from the other (upper case, `-` for `_`). Any well-formed name parses; whether a queue
/// answers for it is the configuration's and the declarations' business.
///
/// Held inline (no allocation, `Copy`), since every target carries one: the name,
/// zero-padded (a name holds no zero byte), so it compares and orders as the name does.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueTargetType([u8; MAX_TYPE_LEN]);

impl QueueTargetType {
    /// The shipped types: what `[[targets.types]]` holds unless configured otherwise.
    pub const LIMITED_DROP: QueueTargetType = Self::known("limited-drop");
    pub const TICKETING_EVENT: QueueTargetType = Self::known("ticketing-event");

    /// The name used in Redis keys, tokens and logs: `LIMITED_DROP`.
    pub fn as_str(&self) -> &str {
        let len = self.0.iter().position(|b| *b == 0).unwrap_or(MAX_TYPE_LEN);
        // Only ASCII is ever stored.
        std::str::from_utf8(&self.0[..len]).unwrap_or_default()
    }

    /// The name used in URLs: `limited-drop`.
    pub fn slug(&self) -> TypeSlug {
        let mut out = [0; MAX_TYPE_LEN];
        for (o, b) in out.iter_mut().zip(self.0) {
            *o = if b == b'_' { b'-' } else { b.to_ascii_lowercase() };
        }
        TypeSlug(out)
    }

    /// Accepts the URL slug only (`limited-drop`), as the HTTP API does.
    pub fn from_slug(s: &str) -> Result<Self, ParseError> {
        Self::build(s, Case::Lower).ok_or_else(|| bad_type(s))
    }

    /// Accepts the slug or the upper-case name (`LIMITED_DROP`), as the CLI, configuration
    /// and tokens do.
    pub fn parse_any(s: &str) -> Result<Self, ParseError> {
        Self::build(s, Case::Lower).or_else(|| Self::build(s, Case::Upper)).ok_or_else(|| bad_type(s))
    }

    /// Only the upper-case name (`LIMITED_DROP`), as in a token's payload.
    pub fn from_name(s: &str) -> Result<Self, ParseError> {
        Self::build(s, Case::Upper).ok_or_else(|| bad_type(s))
    }

    const fn known(slug: &str) -> Self {
        match Self::build(slug, Case::Lower) {
            Some(t) => t,
            None => panic!("a shipped type slug is well formed"),
        }
    }

    /// Words of letters and digits, the first starting with a letter, joined by single
    /// separators (`-` in a slug, `_` in a name), in the one case.
    const fn build(s: &str, case: Case) -> Option<Self> {
        let b = s.as_bytes();
        if b.is_empty() || b.len() > MAX_TYPE_LEN {
            return None;
        }
        let sep = match case {
            Case::Lower => b'-',
            Case::Upper => b'_',
        };
        let mut name = [0; MAX_TYPE_LEN];
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            let letter = match case {
                Case::Lower => c.is_ascii_lowercase(),
                Case::Upper => c.is_ascii_uppercase(),
            };
            if c == sep {
                if i == 0 || i + 1 == b.len() || b[i - 1] == sep {
                    return None;
                }
                name[i] = b'_';
            } else if letter || (i > 0 && c.is_ascii_digit()) {
                name[i] = c.to_ascii_uppercase();
            } else {
                return None;
            }
            i += 1;
        }
        Some(Self(name))
    }
}

/// A type's URL slug, `limited-drop`, held inline; reads as a `&str`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TypeSlug([u8; MAX_TYPE_LEN]);

impl std::ops::Deref for TypeSlug {
    type Target = str;

    fn deref(&self) -> &str {
        let len = self.0.iter().position(|b| *b == 0).unwrap_or(MAX_TYPE_LEN);
        std::str::from_utf8(&self.0[..len]).unwrap_or_default()
    }
}

impl fmt::Display for TypeSlug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

impl fmt::Debug for TypeSlug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

#[derive(Clone, Copy)]
enum Case {
    Lower,
    Upper,
}

fn bad_type(s: &str) -> ParseError {
    ParseError::BadType(s.chars().take(40).collect())
}

impl fmt::Display for QueueTargetType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for QueueTargetType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses a positive 64-bit integer (the form of target ids and user ids).
fn parse_positive(s: &str) -> Result<u64, ParseError> {
    match s.parse::<u64>() {
        Ok(n) if n > 0 && !s.starts_with('+') => Ok(n),
        _ => Err(ParseError::BadId(s.chars().take(40).collect())),
    }
}

/// One queue: a sale of one type with one id, written `LIMITED_DROP:42`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueTarget {
    pub kind: QueueTargetType,
    pub id: u64,
    /// The whole target everywhere but inside the Redis store, which names one shard of a
    /// sharded target with it (`Shard`, `store/redis/keys.rs`).
    pub shard: Shard,
}

impl QueueTarget {
    pub fn new(kind: QueueTargetType, id: u64) -> Self {
        Self { kind, id, shard: Shard::WHOLE }
    }

    /// Shard `index` of `count` of this target.
    pub fn on_shard(self, index: u8, count: u8) -> Self {
        Self { shard: Shard { index, count, lane: self.shard.lane }, ..self }
    }

    /// This target's lane `lane` (shard 0 of 1; [`Self::on_shard`] names a lane's shard).
    pub fn in_lane(self, lane: super::LaneName) -> Self {
        Self { shard: Shard { index: 0, count: if lane.is_public() { self.shard.count } else { 1 }, lane }, ..self }
    }

    /// The text its parts' hash tags are made of: `TYPE:id`, `TYPE:id~lane` for a lane.
    pub fn lane_tag(self) -> String {
        match self.shard.lane.is_public() {
            true => format!("{}:{}", self.kind.as_str(), self.id),
            false => format!("{}:{}~{}", self.kind.as_str(), self.id, self.shard.lane.as_str()),
        }
    }

    /// The whole target, whichever shard this names.
    pub fn whole(self) -> Self {
        Self { shard: Shard::WHOLE, ..self }
    }

    /// From the two URL path segments: `limited-drop`, `42`.
    pub fn from_path(slug: &str, id: &str) -> Result<Self, ParseError> {
        Ok(Self::new(QueueTargetType::from_slug(slug)?, parse_positive(id)?))
    }

    /// From a type name (slug or upper case) and an id string.
    pub fn from_parts(kind: &str, id: &str) -> Result<Self, ParseError> {
        Ok(Self::new(QueueTargetType::parse_any(kind)?, parse_positive(id)?))
    }
}

impl fmt::Display for QueueTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.as_str(), self.id)?;
        if !self.shard.lane.is_public() {
            write!(f, "~{}", self.shard.lane.as_str())?;
        }
        if !self.shard.is_whole() {
            write!(f, "#{}/{}", self.shard.index, self.shard.count)?;
        }
        Ok(())
    }
}

impl FromStr for QueueTarget {
    type Err = ParseError;

    /// `limited-drop:42` or `LIMITED_DROP:42`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, id) = s.split_once(':').ok_or_else(|| ParseError::BadTarget(s.to_owned()))?;
        Self::from_parts(kind, id)
    }
}

/// A buyer, identified by the `X-User-Id` header the apps already send: a shop's own id
/// (an integer, a UUID, a string), taken as is. Two ids are the same user only when they are
/// the same characters: `007` and `7` are two users.
///
/// Shared, not copied: an id travels from the header through the coalescer, the caches and
/// the token; clones bump a count.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserId(Arc<str>);

impl UserId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for UserId {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if (1..=MAX_USER_ID_LEN).contains(&s.len()) && s.bytes().all(is_user_id_byte) {
            Ok(UserId(s.into()))
        } else {
            let shown: String = s.chars().take(40).collect();
            let more = if s.chars().count() > 40 { "…" } else { "" };
            Err(ParseError::BadUser(format!("{:?}{more}", shown)))
        }
    }
}

/// Numbered users (loadgen's buyers, tests): `7` is the id `"7"`.
impl From<u64> for UserId {
    fn from(n: u64) -> Self {
        UserId(n.to_string().into())
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_parses_from_slug_or_name_and_prints_as_name() {
        let a: QueueTarget = "limited-drop:42".parse().unwrap();
        let b: QueueTarget = "LIMITED_DROP:42".parse().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "LIMITED_DROP:42");
        assert_eq!("ticketing-event:7".parse::<QueueTarget>().unwrap().kind, QueueTargetType::TICKETING_EVENT);
    }

    #[test]
    fn any_well_formed_type_parses_and_spells_its_slug_and_name_from_each_other() {
        let t = QueueTargetType::from_slug("flash-coupon2").unwrap();
        assert_eq!((&*t.slug(), t.as_str()), ("flash-coupon2", "FLASH_COUPON2"));
        assert_eq!(QueueTargetType::parse_any("FLASH_COUPON2").unwrap(), t);
        assert_eq!(QueueTargetType::from_name("FLASH_COUPON2").unwrap(), t);
        assert!(QueueTargetType::from_name("flash-coupon2").is_err(), "a token names the type in upper case");
        assert!(QueueTargetType::from_slug("FLASH_COUPON2").is_err(), "a URL names it by its slug");
        let longest = "a".repeat(MAX_TYPE_LEN);
        assert!(QueueTargetType::from_slug(&longest).is_ok());
        for bad in [
            "",
            "-a",
            "a-",
            "a--b",
            "a_b",
            "1a",
            "A-b",
            "Flash-coupon",
            "a b",
            "a.b",
            "é",
            "\u{feff}a",
            "a:b",
            &"a".repeat(MAX_TYPE_LEN + 1),
        ] {
            assert!(QueueTargetType::parse_any(bad).is_err(), "{bad:?}");
        }
        assert!(QueueTargetType::LIMITED_DROP < QueueTargetType::TICKETING_EVENT, "ordered by name");
    }

    #[test]
    fn path_accepts_only_slugs_and_positive_ids() {
        assert!(QueueTarget::from_path("limited-drop", "1").is_ok());
        assert!(QueueTarget::from_path("LIMITED_DROP", "1").is_err());
        for bad in ["0", "-1", "abc", "", "+5", "18446744073709551616", "1.5"] {
            assert!(QueueTarget::from_path("limited-drop", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_user_id_is_any_safe_string_taken_as_is() {
        assert_eq!("7".parse::<UserId>().unwrap(), UserId::from(7));
        assert_ne!("007".parse::<UserId>().unwrap(), UserId::from(7), "never normalised");
        let longest = "a".repeat(MAX_USER_ID_LEN);
        for good in [
            "0",
            "-7",
            "3f2a9c1e-7b4d-4c1e-9a8f-2b6c1d0e9f3a",
            "user_8f3k",
            "a.b+shop@example.com",
            "tenant:42",
            longest.as_str(),
        ] {
            assert_eq!(good.parse::<UserId>().unwrap().as_str(), good);
        }
        let too_long = "a".repeat(MAX_USER_ID_LEN + 1);
        for bad in ["", " 7", "7 ", "a|b", "a{b}", "a,b", "a/b", "a%20b", "é", "a\nb", "a\"b", too_long.as_str()] {
            assert!(bad.parse::<UserId>().is_err(), "{bad:?}");
        }
        // Every printable ASCII character outside the set is refused, alone and inside an id.
        for b in (0u8..=127).filter(|b| !is_user_id_byte(*b)) {
            let c = char::from(b);
            assert!(format!("a{c}b").parse::<UserId>().is_err(), "{c:?}");
        }
        let e = "a|b".parse::<UserId>().unwrap_err().to_string();
        assert!(e.contains("\"a|b\"") && e.contains("1 to 128"), "{e}");
    }
}
