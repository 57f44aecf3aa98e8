//! The queue tokens this instance handed out, remembered until they expire: a user told
//! ADMITTED here is given the same token by every later enter and poll here, whatever Redis
//! holds. A failover that lost the stored token (or the admission itself) then neither sends
//! the user back to WAITING nor mints them a second, different token; nor does a Redis outage
//! (the token, not a DIRECT_ADMITTED one).
//!
//! Bounded: at most [`MAX_TOKENS`] across targets, the oldest forgotten first; an expired token
//! is never answered (the user enters again, as they would with Redis' copy expired).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::domain::{QueueTarget, UserId};
use crate::token::EntryToken;

/// Tokens remembered at most (about 150 bytes each): at 100 admissions per 2-s tick and a
/// 300-s token lifetime, one target has 15,000 live tokens.
pub const MAX_TOKENS: usize = 100_000;

#[derive(Default)]
struct Inner {
    tokens: HashMap<(QueueTarget, UserId), EntryToken>,
    /// Insertion order, for forgetting the oldest and the expired.
    order: VecDeque<(QueueTarget, UserId)>,
}

pub(super) struct IssuedTokens {
    inner: Mutex<Inner>,
    max: usize,
}

impl IssuedTokens {
    pub(super) fn new(max: usize) -> Self {
        Self { inner: Mutex::default(), max }
    }

    /// The user's token, if this instance handed them one that is still valid at `now_s`.
    pub(super) fn get(&self, target: QueueTarget, user: &UserId, now_s: u64) -> Option<EntryToken> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.tokens.get(&(target, user.clone())).filter(|t| t.expires_at > now_s).cloned()
    }

    /// Remembers the token a user was just told; forgets the oldest beyond the bound and the
    /// expired ones at the front.
    pub(super) fn remember(&self, target: QueueTarget, user: &UserId, token: &EntryToken, now_s: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner { tokens, order } = &mut *inner;
        let key = (target, user.clone());
        if tokens.get(&key).is_some_and(|t| t.raw == token.raw) {
            return;
        }
        if tokens.insert(key.clone(), token.clone()).is_none() {
            order.push_back(key);
        }
        while let Some(oldest) = order.front() {
            let expired = tokens.get(oldest).is_none_or(|t| t.expires_at <= now_s);
            if tokens.len() <= self.max && !expired {
                break;
            }
            tokens.remove(oldest);
            order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::QueueTargetType;

    fn target() -> QueueTarget {
        QueueTarget::new(QueueTargetType::LIMITED_DROP, 1)
    }

    fn token(raw: &str, expires_at: u64) -> EntryToken {
        EntryToken { raw: raw.to_owned(), expires_at }
    }

    #[test]
    fn a_remembered_token_is_answered_until_it_expires() {
        let t = IssuedTokens::new(10);
        t.remember(target(), &UserId::from(1), &token("a", 100), 50);
        assert_eq!(t.get(target(), &UserId::from(1), 99).map(|t| t.raw), Some("a".to_owned()));
        assert_eq!(t.get(target(), &UserId::from(1), 100), None, "expired");
        assert_eq!(t.get(target(), &UserId::from(2), 50), None, "never handed out");
    }

    #[test]
    fn the_oldest_and_the_expired_are_forgotten_first() {
        let t = IssuedTokens::new(2);
        for u in 1..=3 {
            t.remember(target(), &UserId::from(u), &token(&u.to_string(), 100 + u), 50);
        }
        assert_eq!(t.get(target(), &UserId::from(1), 50), None, "beyond the bound");
        assert!(t.get(target(), &UserId::from(3), 50).is_some());
        t.remember(target(), &UserId::from(4), &token("4", 200), 102);
        assert_eq!(t.get(target(), &UserId::from(2), 50), None, "expired at the front");
        assert!(t.get(target(), &UserId::from(4), 150).is_some());
    }
}
