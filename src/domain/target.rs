//! Queue targets (`LIMITED_DROP:42`) and user ids, parsed once at the edge.

use std::fmt;
use std::str::FromStr;

/// Why a target, type or user id could not be parsed; the text is shown to API callers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("unknown target type `{0}`: expected limited-drop or ticketing-event")]
    UnknownType(String),
    #[error("`{0}` is not a positive 64-bit integer id")]
    BadId(String),
    #[error("`{0}` is not a target: expected TYPE:ID, e.g. limited-drop:42")]
    BadTarget(String),
    #[error("`{0}` is not a range of targets: expected TYPE:FIRST-LAST, e.g. limited-drop:1000-1999")]
    BadRange(String),
}

/// The kind of sale a queue protects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QueueTargetType {
    LimitedDrop,
    TicketingEvent,
}

impl QueueTargetType {
    pub const ALL: [QueueTargetType; 2] = [Self::LimitedDrop, Self::TicketingEvent];

    /// The name used in Redis keys, tokens and logs: `LIMITED_DROP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LimitedDrop => "LIMITED_DROP",
            Self::TicketingEvent => "TICKETING_EVENT",
        }
    }

    /// The name used in URLs: `limited-drop`.
    pub fn slug(self) -> &'static str {
        match self {
            Self::LimitedDrop => "limited-drop",
            Self::TicketingEvent => "ticketing-event",
        }
    }

    /// Accepts the URL slug only (`limited-drop`), as the HTTP API does.
    pub fn from_slug(s: &str) -> Result<Self, ParseError> {
        Self::ALL.into_iter().find(|t| t.slug() == s).ok_or_else(|| ParseError::UnknownType(s.to_owned()))
    }

    /// Accepts the slug or the upper-case name (`LIMITED_DROP`), as the CLI and tokens do.
    pub fn parse_any(s: &str) -> Result<Self, ParseError> {
        Self::ALL
            .into_iter()
            .find(|t| t.slug() == s || t.as_str() == s)
            .ok_or_else(|| ParseError::UnknownType(s.to_owned()))
    }
}

impl fmt::Display for QueueTargetType {
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
}

impl QueueTarget {
    pub fn new(kind: QueueTargetType, id: u64) -> Self {
        Self { kind, id }
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
        write!(f, "{}:{}", self.kind.as_str(), self.id)
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

/// A buyer, identified by the `X-User-Id` header the apps already send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserId(pub u64);

impl FromStr for UserId {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_positive(s).map(UserId)
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
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
        assert_eq!("ticketing-event:7".parse::<QueueTarget>().unwrap().kind, QueueTargetType::TicketingEvent);
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
    fn user_id_must_be_positive_integer() {
        assert_eq!("7".parse::<UserId>().unwrap(), UserId(7));
        for bad in ["0", "-7", "x", " 7", ""] {
            assert!(bad.parse::<UserId>().is_err(), "{bad}");
        }
    }
}
