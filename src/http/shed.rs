//! The in-flight budgets: how many requests an instance works on at once, and whose are shed
//! when that is too many.
//!
//! - Requests are counted by class, each class with a budget of its own ([`Class`]): the
//!   queue's work (queue API calls, `/gate/verify`, `/gate/release`, gated purchases) and everything the gate
//!   forwards unchecked to the rest of the app. Forwarded traffic, however slow the app behind
//!   vq or the client sending it, never takes a place the queue needs.
//! - Within a class no client holds more than its share: a request that finds its class full
//!   takes the place of the newest preemptable request of the heaviest client, if that client
//!   holds at least two more places than the newcomer's; that request is told it was preempted
//!   (the edge answers it 503 OVERLOADED at once). Else the newcomer is shed. Only requests
//!   whose abandonment changes nothing are preemptable (the edge says which): a queue API call
//!   (a call already in Redis runs to its end, as when its client hangs up) or a safe-method
//!   request forwarded unchecked; never a gated purchase (its token claim and pacing place are
//!   taken) nor a `/gate/verify` check. A client is its peer
//!   address first, then, among the requests of the heaviest address (all of them, behind a
//!   proxy), its user: `X-User-Id`, the visitor token, or none ([`Client`]).
//!
//! It must not do IO or know status codes: the edge layer answers for it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// The budgets requests are counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Queue API calls, `/gate/verify`, `/gate/release` and gated purchases
    /// (`http.max_in_flight`).
    Queue,
    /// Requests the gate forwards unchecked (`http.max_forwarded_in_flight`).
    Forwarded,
}

/// Who holds a place: the peer address, and the user among that address' requests (a hash of
/// the user id or visitor token as sent; `0` for none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Client {
    pub addr: IpAddr,
    pub user: u64,
}

/// One class's places.
pub struct Budget {
    max: usize,
    // Held only for a few map operations; a scan of the clients only when the class is full.
    load: Mutex<Load>,
}

#[derive(Default)]
struct Load {
    total: usize,
    next_id: u64,
    addrs: HashMap<IpAddr, AddrLoad>,
}

#[derive(Default)]
struct AddrLoad {
    count: usize,
    /// Each user's places, oldest first.
    users: HashMap<u64, Vec<Held>>,
}

struct Held {
    id: u64,
    preemptable: bool,
    preempt: CancellationToken,
}

/// A place in a budget, freed on drop (the answer made, or the client gone).
pub struct Slot<'a> {
    budget: &'a Budget,
    client: Client,
    id: u64,
    preempt: CancellationToken,
}

impl Budget {
    pub fn new(max: u64) -> Self {
        Self { max: usize::try_from(max).unwrap_or(usize::MAX), load: Mutex::default() }
    }

    fn lock(&self) -> MutexGuard<'_, Load> {
        // A panic while holding it leaves counts that are still counts: keep serving.
        self.load.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for `client`, taking the heaviest client's newest preemptable one if the budget
    /// is full and that client holds at least two more than `client`; `None`: shed `client`'s
    /// request. A `preemptable` request's place may be taken in turn.
    pub fn admit(&self, client: Client, preemptable: bool) -> Option<Slot<'_>> {
        let mut load = self.lock();
        if load.total >= self.max {
            let victim = load.victim(client)?;
            load.preempt_newest(victim)?;
        }
        let id = load.next_id;
        load.next_id += 1;
        let preempt = CancellationToken::new();
        load.total += 1;
        let addr = load.addrs.entry(client.addr).or_default();
        addr.count += 1;
        addr.users.entry(client.user).or_default().push(Held { id, preemptable, preempt: preempt.clone() });
        Some(Slot { budget: self, client, id, preempt })
    }

    /// Places taken now.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.lock().total
    }
}

impl Load {
    /// Whose place a newcomer `me` may take: a client holding at least two more than `me`,
    /// by address first, then by user within the heaviest address.
    fn victim(&self, me: Client) -> Option<Client> {
        let mine = self.addrs.get(&me.addr);
        let (addr, heaviest) = self.addrs.iter().max_by_key(|(_, a)| a.count)?;
        let heaviest_user = |a: &AddrLoad| a.users.iter().max_by_key(|(_, h)| h.len()).map(|(u, h)| (*u, h.len()));
        if *addr != me.addr && heaviest.count >= mine.map_or(0, |a| a.count) + 2 {
            let (user, _) = heaviest_user(heaviest)?;
            return Some(Client { addr: *addr, user });
        }
        let mine = mine?;
        let my_count = mine.users.get(&me.user).map_or(0, Vec::len);
        let (user, count) = heaviest_user(mine)?;
        (count >= my_count + 2).then_some(Client { addr: me.addr, user })
    }

    /// Takes `victim`'s newest preemptable place and tells its request; `None` if it has none.
    fn preempt_newest(&mut self, victim: Client) -> Option<()> {
        let held = self.addrs.get_mut(&victim.addr)?.users.get_mut(&victim.user)?;
        let i = held.iter().rposition(|h| h.preemptable)?;
        held.remove(i).preempt.cancel();
        self.forget(victim, None);
        Some(())
    }

    /// Counts one place of `client` less, removing place `id` from its list if given.
    fn forget(&mut self, client: Client, id: Option<u64>) {
        let Some(addr) = self.addrs.get_mut(&client.addr) else { return };
        if let Some(held) = addr.users.get_mut(&client.user) {
            if let Some(id) = id
                && let Some(i) = held.iter().position(|h| h.id == id)
            {
                held.remove(i);
            }
            if held.is_empty() {
                addr.users.remove(&client.user);
            }
        }
        addr.count -= 1;
        if addr.count == 0 {
            self.addrs.remove(&client.addr);
        }
        self.total -= 1;
    }
}

impl Slot<'_> {
    /// Resolves when another client's request took this place: answer at once.
    pub fn preempted(&self) -> WaitForCancellationFuture<'_> {
        self.preempt.cancelled()
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut load = self.budget.lock();
        // A preempted place was counted out when it was taken (under this lock).
        if !self.preempt.is_cancelled() {
            load.forget(self.client, Some(self.id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(addr: u8, user: u64) -> Client {
        Client { addr: IpAddr::from([127, 0, 0, addr]), user }
    }

    #[test]
    fn below_the_budget_everyone_gets_a_place_and_dropping_frees_it() {
        let b = Budget::new(3);
        let slots: Vec<_> = (0..3).map(|_| b.admit(client(1, 0), true).expect("a place")).collect();
        assert_eq!(b.in_flight(), 3);
        assert!(b.admit(client(1, 0), true).is_none(), "one client alone is shed at the budget");
        drop(slots);
        assert_eq!(b.in_flight(), 0);
        assert!(b.load.lock().unwrap().addrs.is_empty());
    }

    #[test]
    fn a_full_budget_sheds_the_heaviest_address_first() {
        let b = Budget::new(4);
        let heavy: Vec<_> = (0..4).map(|_| b.admit(client(1, 0), true).unwrap()).collect();
        let light = b.admit(client(2, 0), true).expect("a light client takes a heavy one's place");
        assert!(heavy[3].preempt.is_cancelled(), "the newest of the heaviest is told");
        assert!(heavy[..3].iter().all(|s| !s.preempt.is_cancelled()));
        assert_eq!(b.in_flight(), 4);
        let second = b.admit(client(2, 0), true).expect("3 against 1: still two more");
        // 2 against 2: nobody holds two more, the newcomer is shed.
        assert!(b.admit(client(2, 0), true).is_none());
        drop((heavy, light, second));
        assert_eq!(b.in_flight(), 0);
        assert!(b.load.lock().unwrap().addrs.is_empty());
    }

    #[test]
    fn behind_one_address_the_heaviest_user_is_shed_first() {
        let b = Budget::new(4);
        let heavy: Vec<_> = (0..3).map(|_| b.admit(client(1, 7), true).unwrap()).collect();
        let other = b.admit(client(1, 8), true).unwrap();
        let newcomer = b.admit(client(1, 9), true).expect("user 7 holds 3, user 9 none");
        assert!(heavy[2].preempt.is_cancelled());
        assert!(b.admit(client(1, 7), true).is_none(), "the heavy user is shed, not the others");
        drop((heavy, other, newcomer));
        assert_eq!(b.in_flight(), 0);
    }

    #[test]
    fn requests_that_are_not_preemptable_keep_their_places() {
        let b = Budget::new(3);
        let purchases: Vec<_> = (0..3).map(|_| b.admit(client(1, 7), false).unwrap()).collect();
        assert!(b.admit(client(2, 0), true).is_none(), "a gated purchase is never taken over");
        drop(purchases);
        let mixed = [b.admit(client(1, 7), true).unwrap(), b.admit(client(1, 7), false).unwrap()];
        let third = b.admit(client(1, 7), false).unwrap();
        let light = b.admit(client(2, 0), true).expect("the preemptable one goes");
        assert!(mixed[0].preempt.is_cancelled() && !mixed[1].preempt.is_cancelled());
        drop((mixed, third, light));
        assert_eq!(b.in_flight(), 0);
    }

    #[test]
    fn many_addresses_of_one_user_each_are_shed_as_addresses() {
        let b = Budget::new(6);
        let flood: Vec<_> = (10..16).map(|a| b.admit(client(a, 5), true).unwrap()).collect();
        // Every address holds one: a newcomer with none is shed (no one holds two more).
        assert!(b.admit(client(2, 1), true).is_none());
        drop(flood);
    }
}
