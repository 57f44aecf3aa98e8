//! Proof of work at entry (`entry.pow_bits`, `vq pow set`): what a new user must solve
//! before getting a place. The checks are in [`crate::pow`]; here, whom they apply to and the
//! one use of each challenge.

use super::QueueService;
use crate::domain::{QueueTarget, UserId};
use crate::pow::{self, Challenge, PowError};
use crate::store::prelude::*;

/// What an enter must do before the queue sees it.
#[derive(Debug)]
pub enum EntryCheck {
    /// On to the queue: no work asked, a place already held, or a solution checked and spent.
    Proceed,
    /// A new user without a solution: this challenge, and no place.
    Challenge(Challenge),
    Refused(PowError),
}

impl QueueService {
    /// The difficulty in force: `vq pow set`'s, else `entry.pow_bits`.
    pub fn pow_bits(&self) -> u8 {
        self.flag().pow_bits.unwrap_or(self.settings.entry.pow_bits)
    }

    /// Whether `user` may go on to enter `target`, given their solution (seed, nonce) if any.
    /// Work is asked only where the queue applies to the user and Redis answers; a user who
    /// holds a place already enters again freely. A store error lets the enter go on, which
    /// meets the same error and answers as it does without proof of work.
    pub async fn entry_check(&self, target: QueueTarget, user: &UserId, solution: Option<(&str, &str)>) -> EntryCheck {
        let bits = self.pow_bits();
        if bits == 0 || !self.queue_applies(target, user) || self.store.silent_for(target, user) {
            return EntryCheck::Proceed;
        }
        let now = self.now_s();
        if let Some((seed, nonce)) = solution {
            let checked = pow::check(&self.secret, seed, nonce, target, user, now, bits);
            let solved = match checked {
                Ok(s) => s,
                Err(e) => return refused(e),
            };
            return match self.bounded(target, self.store.spend_once(target, &solved.id, solved.expires_at * 1000)).await
            {
                Ok(false) => refused(PowError::Reused),
                Ok(true) | Err(_) => {
                    crate::metrics::pow("solved");
                    EntryCheck::Proceed
                }
            };
        }
        if self.local_answer(target, user).is_some() || self.issued.get(target, user, now).is_some() {
            return EntryCheck::Proceed;
        }
        match self.bounded(target, self.store.holds_place(target, user.clone())).await {
            Ok(false) => {}
            Ok(true) | Err(_) => return EntryCheck::Proceed,
        }
        let mut random = [0u8; 16];
        if getrandom::fill(&mut random).is_err() {
            return EntryCheck::Proceed;
        }
        crate::metrics::pow("challenged");
        let ttl = self.settings.entry.pow_ttl_s;
        EntryCheck::Challenge(pow::challenge(&self.secret, random, target, user, bits, now + ttl))
    }
}

fn refused(e: PowError) -> EntryCheck {
    crate::metrics::pow("refused");
    EntryCheck::Refused(e)
}
