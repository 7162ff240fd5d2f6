//! A memory-touching workload for the NUMA tests in the v2 VM (tests/vm/numa.sh): allocates
//! MIB mebibytes, writes every page (so each is really allocated, on a node the process's
//! cpuset allows), says `memtouch: MIB MiB touched` on stdout, then holds the memory for
//! SECONDS (default: until killed), writing one byte per page again every second so that the
//! pages stay in use as a database's buffers do.
//!
//! ```text
//! memtouch MIB [SECONDS]
//! ```
//! Build: `cargo build --release --example memtouch`, or with nothing but std as scripts/test.sh
//! does: `rustc -O --edition 2021 -o target/release/examples/memtouch examples/memtouch.rs`.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(mib) = args.first().and_then(|a| a.parse::<usize>().ok()) else {
        eprintln!("usage: memtouch MIB [SECONDS]");
        return ExitCode::from(2);
    };
    let hold = args
        .get(1)
        .map(|s| s.parse::<u64>().map(Duration::from_secs));
    let hold = match hold {
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => {
            eprintln!("memtouch: SECONDS: {e}");
            return ExitCode::from(2);
        }
        None => None,
    };
    let mut buf = vec![0u8; mib << 20];
    let mut round: u8 = 1;
    touch(&mut buf, round);
    println!("memtouch: {mib} MiB touched");
    let _ = std::io::stdout().flush();
    let start = Instant::now();
    while hold.is_none_or(|h| start.elapsed() < h) {
        std::thread::sleep(Duration::from_secs(1));
        round = round.wrapping_add(1).max(1);
        touch(&mut buf, round);
    }
    ExitCode::SUCCESS
}

/// One non-zero byte per page: a zero write could be left on the shared zero page.
fn touch(buf: &mut [u8], value: u8) {
    for i in (0..buf.len()).step_by(PAGE) {
        buf[i] = value;
    }
    std::hint::black_box(&buf);
}
