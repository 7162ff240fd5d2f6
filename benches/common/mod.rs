//! What the benches share: teardown that also runs when a bench is stopped by a signal.
//!
//! A bench creates groups, loop devices, mounts and processes on the real host. `Drop` guards
//! remove them on a normal end and on a panic, but not when the bench is killed (`timeout`, ^C,
//! a `kill` of a held bench): that left groups behind, the memory ones nested in the bench's own
//! memory cgroup. So a bench calls `trap_signals` first in `main`, and registers each thing it
//! creates with `on_exit`: the step runs once, when its guard drops or at SIGINT, SIGTERM or
//! SIGHUP, whichever comes first; at a signal every registered step runs, newest first, and the
//! bench exits 128 + the signal.
//!
//! Each bench includes this file with `mod common;` and uses what it needs.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

type Step = Box<dyn FnOnce() + Send>;

/// The registered steps, oldest first. A step runs under the lock, so a signal that arrives
/// while a guard's step runs waits for it (and does not run it again).
static STEPS: Mutex<Vec<(u64, Step)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(1);

fn steps() -> std::sync::MutexGuard<'static, Vec<(u64, Step)>> {
    // A step that panicked leaves the list as it was: the others still need to run.
    STEPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and in every thread it starts later) and
/// takes them in one thread that runs the registered steps and exits 128 + the signal. Call it
/// first in `main`, before any thread or child. Children started with `Command` get an empty
/// signal mask (the standard library resets it before exec); children forked without exec
/// inherit the blocked set.
pub fn trap_signals(bench: &'static str) {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(sig);
    }
    set.thread_block()
        .expect("blocking SIGINT, SIGTERM and SIGHUP");
    std::thread::spawn(move || {
        let Ok(sig) = set.wait() else { return };
        eprintln!("{bench}: {sig}, cleaning up");
        let mut steps = steps();
        while let Some((_, step)) = steps.pop() {
            step();
        }
        std::process::exit(128 + sig as i32);
    });
}

/// A registered step: runs when dropped, unless a signal's teardown ran it first.
#[must_use = "the step runs when the guard drops"]
pub struct Guard(u64);

/// Registers `step` to run once: when the returned guard drops, or at a signal.
pub fn on_exit(step: impl FnOnce() + Send + 'static) -> Guard {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    steps().push((id, Box::new(step)));
    Guard(id)
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut steps = steps();
        if let Some(i) = steps.iter().position(|(id, _)| *id == self.0) {
            let (_, step) = steps.remove(i);
            step();
        }
    }
}
