//! Time and counts as the store's signatures take them: a tick length, a timeout and a batch
//! size are all `u64` underneath, and a call that swapped two of them would compile. Each is
//! its own type here, so it does not.

/// A span of time in milliseconds (a tick's length, a heartbeat timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ms(pub u64);

/// A number of users or purchases (a batch, a per-tick budget, a bound on one call's work).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Users(pub u64);

/// A number of ticks (how far ahead pacing may reserve).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticks(pub u64);

macro_rules! plain {
    ($($t:ident),*) => {$(
        impl $t {
            pub const fn get(self) -> u64 {
                self.0
            }
        }

        impl From<$t> for u64 {
            fn from(v: $t) -> u64 {
                v.0
            }
        }
    )*};
}

plain!(Ms, Users, Ticks);
