//! Every process's comm in one pass of an eBPF task iterator (bpf/tasks.bpf.c), for scans of
//! many processes under rules on `comm`: reading /proc/PID/comm is an open, a read and a close
//! per process (4-5 µs of CPU each here, most of it the kernel's path walk and file setup),
//! the iterator a 20-byte record per process from a few reads, after a load of about 5 ms
//! (libbpf parses the kernel's BTF, the kernel verifies the program). Scans below `WORTH_IT`
//! processes, hosts without BTF or without CAP_BPF, a dbcage in a pid namespace of its own (the
//! iterator's pids are the host's, not its /proc's) and fixture trees read /proc as before, and
//! so does any process the iterator did not name (born since, or left out by the kernel).

use std::io::Read as _;

use libbpf_rs::ObjectBuilder;

/// The compiled iterator (build.rs).
const OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tasks.bpf.o"));
/// Its program (tasks.bpf.c).
const PROGRAM: &str = "dbcage_tasks";
/// A record: pid (u32, host order), then the 16 bytes of comm, NUL-padded.
const RECORD: usize = 20;

/// The number of processes from which a scan reads comm through the iterator. Its load costs
/// what reading /proc/PID/comm of about 1,100 processes does in CPU, and of about 2,200 in
/// time where two threads read /proc (`procs::read_pids`); bench/README has the figures.
pub const WORTH_IT: usize = 2_000;

/// The kernel's comm of each user-space process at one moment, in pid order.
#[derive(Debug, Default)]
pub struct Comms(Vec<(u32, [u8; 16])>);

impl Comms {
    /// Loads the iterator, runs it once and unloads it. The error says why it could not (no
    /// BTF, a capability missing, the kernel refused the program): the caller reads /proc.
    pub fn read() -> Result<Comms, String> {
        crate::bpf::prepare().map_err(|e| e.to_string())?;
        crate::bpf::take_log();
        let failed = |step: &str, e: libbpf_rs::Error| {
            format!("{step} the task iterator: {e}{}", crate::bpf::take_log())
        };
        let object = ObjectBuilder::default()
            .open_memory(OBJECT)
            .map_err(|e| failed("opening", e))?
            .load()
            .map_err(|e| failed("loading", e))?;
        let program = object
            .progs_mut()
            .find(|p| p.name() == PROGRAM)
            .ok_or_else(|| format!("the task iterator has no program {PROGRAM}"))?;
        let link = program.attach().map_err(|e| failed("attaching", e))?;
        let mut iter = libbpf_rs::Iter::new(&link).map_err(|e| failed("opening", e))?;
        let mut raw = Vec::with_capacity(64 * 1024);
        iter.read_to_end(&mut raw)
            .map_err(|e| format!("reading the task iterator: {e}"))?;
        let (reader, comms) = Comms::parse(&raw).ok_or("the task iterator wrote no header")?;
        // Its pids are the initial pid namespace's; /proc's are this process's namespace's.
        let own = std::process::id();
        if reader != own {
            return Err(format!(
                "this process is in a pid namespace of its own (pid {own} here, {reader} on the \
                 host): the iterator's pids are not /proc's"
            ));
        }
        Ok(comms)
    }

    /// The iterator's output: the header's pid (the reader's, in the initial pid namespace)
    /// and the records after it; a truncated last one is left out. `None` without a header.
    fn parse(raw: &[u8]) -> Option<(u32, Comms)> {
        let (header, raw) = raw.split_at_checked(RECORD)?;
        let reader = u32::from_ne_bytes(header[..4].try_into().expect("4 bytes"));
        let mut records: Vec<(u32, [u8; 16])> = raw
            .chunks_exact(RECORD)
            .map(|rec| {
                let pid = u32::from_ne_bytes(rec[..4].try_into().expect("4 bytes"));
                (pid, rec[4..].try_into().expect("16 bytes"))
            })
            .collect();
        // The kernel walks pids in order (`get` relies on it); kept sure at the cost of a check.
        if !records.is_sorted_by_key(|r| r.0) {
            records.sort_by_key(|r| r.0);
        }
        let comms = Comms(records);
        Some((reader, comms))
    }

    /// The comm of a process, as /proc/PID/comm has it (without its newline); `None` for a
    /// process the iterator did not see (born since, or a kernel thread).
    pub fn get(&self, pid: u32) -> Option<&[u8]> {
        let i = self.0.binary_search_by_key(&pid, |r| r.0).ok()?;
        let name = &self.0[i].1;
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        Some(&name[..len])
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: u32, comm: &str) -> Vec<u8> {
        let mut r = pid.to_ne_bytes().to_vec();
        let mut name = [0u8; 16];
        name[..comm.len()].copy_from_slice(comm.as_bytes());
        r.extend_from_slice(&name);
        r
    }

    #[test]
    fn records_parse_in_pid_order_after_the_header_and_a_cut_one_is_left_out() {
        let mut raw = [
            record(4242, ""),
            record(30, "postgres"),
            record(7, "ora_pmon_ORCL1"),
            record(12, ""),
        ]
        .concat();
        raw.extend_from_slice(&record(40, "cut")[..9]);
        let (reader, comms) = Comms::parse(&raw).unwrap();
        assert_eq!(reader, 4242);
        assert_eq!(comms.len(), 3);
        assert_eq!(comms.get(7), Some(&b"ora_pmon_ORCL1"[..]));
        assert_eq!(comms.get(30), Some(&b"postgres"[..]));
        assert_eq!(comms.get(12), Some(&b""[..]));
        assert_eq!(comms.get(40), None);
        let full = [record(1, ""), record(5, "abcdefghijklmnop")].concat();
        assert_eq!(
            Comms::parse(&full).unwrap().1.get(5),
            Some(&b"abcdefghijklmnop"[..])
        );
        assert!(Comms::parse(&record(1, "")[..19]).is_none(), "no header");
    }
}
