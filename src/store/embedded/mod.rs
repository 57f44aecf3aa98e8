//! The embedded store's server: an in-process keyspace with Redis' semantics
//! (`keyspace/`) and a Lua 5.1 host that runs vq's function library over it (`lua.rs`), on
//! one thread of their own that serves commands in the order they come, as Redis does, so a
//! script or a pipeline is atomic without a lock. [`Embedded`] is the handle: clones share the
//! one server, which stops when the last handle goes.
//!
//! The Redis store talks to it as to a server (`store/redis/conn.rs`, `Link::Embedded`), so
//! `--store memory` runs the same glue and the same scripts as Redis; only the keyspace's
//! commands and the host are written here. What it must not do: hold a rule of the queue (those
//! live in `lua/`), or answer a command it does not know as if it did.

mod keyspace;
mod lua;
mod reply;

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::mpsc;

use tokio::sync::oneshot;

use self::keyspace::Keyspace;
use self::lua::Host;
pub use self::reply::Reply;
use crate::clock::SharedClock;

/// One round trip: commands served back to back, nothing else between them.
struct Job {
    cmds: Vec<Vec<Vec<u8>>>,
    reply: oneshot::Sender<Vec<Reply>>,
}

/// A handle on the embedded server.
#[derive(Clone)]
pub struct Embedded {
    jobs: mpsc::Sender<Job>,
}

impl Embedded {
    /// Starts the server on a thread of its own, its keys expiring by `clock`.
    pub fn start(clock: SharedClock) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new().name("vq-embedded".into()).spawn(move || serve(clock, rx))?;
        Ok(Self { jobs })
    }

    /// Runs `cmds` one after another, nothing else between them, and answers each.
    pub async fn run(&self, cmds: Vec<Vec<Vec<u8>>>) -> Vec<Reply> {
        let (tx, rx) = oneshot::channel();
        if self.jobs.send(Job { cmds, reply: tx }).is_err() {
            return vec![Reply::err("ERR the embedded store stopped")];
        }
        rx.await.unwrap_or_else(|_| vec![Reply::err("ERR the embedded store stopped")])
    }

    /// Runs one command.
    pub async fn one(&self, cmd: Vec<Vec<u8>>) -> Reply {
        self.run(vec![cmd]).await.pop().unwrap_or(Reply::Nil)
    }
}

fn serve(clock: SharedClock, jobs: mpsc::Receiver<Job>) {
    let ks = Rc::new(RefCell::new(Keyspace::new(clock)));
    let mut host = match Host::new(ks.clone()) {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::error!("the embedded store's Lua host did not start: {e}");
            None
        }
    };
    for job in jobs {
        let replies = job
            .cmds
            .iter()
            .map(|c| {
                // A bug in one command answers that command with an error; the server goes on.
                std::panic::catch_unwind(AssertUnwindSafe(|| exec(&ks, host.as_mut(), c))).unwrap_or_else(|_| {
                    ks.borrow_mut().freeze_time(None);
                    Reply::err("ERR the embedded store failed on this command")
                })
            })
            .collect();
        let _ = job.reply.send(replies);
    }
}

/// One command: the server's own (functions, replication, introspection) or the keyspace's.
fn exec(ks: &Rc<RefCell<Keyspace>>, host: Option<&mut Host>, cmd: &[Vec<u8>]) -> Reply {
    let name = cmd.first().map(|n| String::from_utf8_lossy(n).to_ascii_uppercase()).unwrap_or_default();
    match (name.as_str(), host) {
        ("FCALL" | "FCALL_RO", Some(h)) => h.fcall(&cmd[1..]),
        ("FUNCTION", Some(h)) => h.function(&cmd[1..]),
        ("FCALL" | "FCALL_RO" | "FUNCTION", None) => Reply::err("ERR the embedded store has no Lua host"),
        // No replicas: every write is as durable as it gets at once, so any count waited for is
        // reached (the Redis store's durable writes then cost nothing here).
        ("WAIT", _) => Reply::Int(cmd.get(1).and_then(|n| std::str::from_utf8(n).ok()?.parse().ok()).unwrap_or(0)),
        ("ROLE", _) => Reply::Array(vec![Reply::bulk("master"), Reply::Int(0), Reply::Array(Vec::new())]),
        ("INFO", _) => Reply::Bulk(
            format!("# Memory\r\nused_memory:0\r\n# Keyspace\r\nkeys:{}\r\n", ks.borrow_mut().len()).into_bytes(),
        ),
        ("SELECT" | "CLIENT" | "READONLY", _) => Reply::ok(),
        _ => ks.borrow_mut().exec(cmd),
    }
}
