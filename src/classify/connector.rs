//! The kernel's process events through the netlink proc connector (`CONFIG_PROC_EVENTS`):
//! fork, exec, uid/gid and comm changes, exit. Hand-written on raw sockets (see CONVENTIONS.md):
//! the `cnproc` crate hides ENOBUFS, and a lost event must surface here so the agent rescans.
//! Layouts: include/uapi/linux/{netlink,connector,cn_proc}.h.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::libc;

const NETLINK_CONNECTOR: libc::c_int = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const NLMSG_HDRLEN: usize = 16;
const CN_MSG_LEN: usize = 20;
const EVENT_HDR_LEN: usize = 16;

/// `what` of the connector's answer to a subscription (PROC_EVENT_NONE).
const PROC_EVENT_NONE: u32 = 0;
const PROC_EVENT_FORK: u32 = 0x0000_0001;
const PROC_EVENT_EXEC: u32 = 0x0000_0002;
const PROC_EVENT_UID: u32 = 0x0000_0004;
const PROC_EVENT_GID: u32 = 0x0000_0040;
const PROC_EVENT_COMM: u32 = 0x0000_0200;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;

/// The events the daemon acts on: exec, uid/gid and comm changes (a process may now match), and
/// fork (a child inherits its parent's tenant, and a PID that is reused must not). Exits are not
/// needed (an exited PID's bookkeeping is overwritten by the fork that reuses it, and dropped at
/// the next rescan); on a storm of short-lived processes they are a third of all events.
pub const DAEMON_EVENTS: u32 =
    PROC_EVENT_FORK | PROC_EVENT_EXEC | PROC_EVENT_UID | PROC_EVENT_GID | PROC_EVENT_COMM;

/// Whether the running kernel filters events per listener (`struct proc_input`, Linux 6.6).
/// Older kernels silently ignore a subscription in that form, so it must not be sent there.
pub fn kernel_filters_events() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .and_then(|r| parse_release(&r))
        .is_some_and(|v| v >= (6, 6))
}

/// `6.18.0-1-amd64` → (6, 18).
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut it = release.trim().split(['.', '-']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// One process event; pids are thread-group ids (processes) unless said otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcEvent {
    /// A new process (not a new thread): `parent` forked `child`.
    Fork {
        parent: u32,
        child: u32,
    },
    Exec {
        pid: u32,
    },
    /// uid or gid changed.
    Ids {
        pid: u32,
    },
    /// The main thread was renamed (prctl PR_SET_NAME / /proc/PID/comm).
    Comm {
        pid: u32,
    },
    Exit {
        pid: u32,
    },
    /// The connector's answer to a subscription: sent to every listener whenever any process
    /// subscribes (another daemon, a test), so it says nothing about this one.
    Acknowledgement,
    /// Anything else (a thread fork, ptrace, sid, coredump): nothing to do.
    Other,
}

/// An event and when the kernel emitted it (CLOCK_MONOTONIC, ns): the daemon measures its whole
/// delay from here, time queued in the socket included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timed {
    pub event: ProcEvent,
    pub kernel_ns: u64,
}

fn u64_at(buf: &[u8], off: usize) -> Option<u64> {
    buf.get(off..off + 8)
        .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
}

fn u32_at(buf: &[u8], off: usize) -> Option<u32> {
    buf.get(off..off + 4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// Parses one `proc_event` (after the netlink and connector headers).
pub fn parse_event(ev: &[u8]) -> Option<ProcEvent> {
    let what = u32_at(ev, 0)?;
    let data = ev.get(EVENT_HDR_LEN..)?;
    Some(match what {
        PROC_EVENT_FORK => {
            // parent_pid, parent_tgid, child_pid, child_tgid
            let (child_pid, child_tgid) = (u32_at(data, 8)?, u32_at(data, 12)?);
            if child_pid != child_tgid {
                ProcEvent::Other // a new thread
            } else {
                ProcEvent::Fork {
                    parent: u32_at(data, 4)?,
                    child: child_tgid,
                }
            }
        }
        PROC_EVENT_EXEC => ProcEvent::Exec {
            pid: u32_at(data, 4)?,
        },
        PROC_EVENT_UID | PROC_EVENT_GID => {
            // A set*id call changes every thread's credentials, one event each (glibc's setxid
            // broadcast): the main thread's stands for the process.
            let (pid, tgid) = (u32_at(data, 0)?, u32_at(data, 4)?);
            if pid != tgid {
                ProcEvent::Other
            } else {
                ProcEvent::Ids { pid: tgid }
            }
        }
        PROC_EVENT_COMM => {
            let (pid, tgid) = (u32_at(data, 0)?, u32_at(data, 4)?);
            if pid != tgid {
                ProcEvent::Other // a thread renamed itself; /proc/TGID/comm is unchanged
            } else {
                ProcEvent::Comm { pid: tgid }
            }
        }
        PROC_EVENT_EXIT => {
            let (pid, tgid) = (u32_at(data, 0)?, u32_at(data, 4)?);
            if pid != tgid {
                ProcEvent::Other
            } else {
                ProcEvent::Exit { pid: tgid }
            }
        }
        PROC_EVENT_NONE => ProcEvent::Acknowledgement,
        _ => ProcEvent::Other,
    })
}

/// Splits a received datagram into netlink messages and parses the proc events in them.
pub fn parse_datagram(buf: &[u8], out: &mut Vec<Timed>) {
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let Some(len) = u32_at(buf, off).map(|l| l as usize) else {
            break;
        };
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            break;
        }
        let msg = &buf[off + NLMSG_HDRLEN..off + len];
        if let (Some(idx), Some(val)) = (u32_at(msg, 0), u32_at(msg, 4)) {
            if idx == CN_IDX_PROC && val == CN_VAL_PROC {
                if let Some(ev) = msg.get(CN_MSG_LEN..) {
                    if let (Some(event), Some(kernel_ns)) = (parse_event(ev), u64_at(ev, 8)) {
                        out.push(Timed { event, kernel_ns });
                    }
                }
            }
        }
        off += (len + 3) & !3; // NLMSG_ALIGN
    }
}

/// The socket filter (classic BPF) the daemon's socket carries, so that events it has no use for
/// are dropped in the kernel before they are queued, woken for and read:
/// - the events of threads: a thread's fork, and the rename, uid/gid change or exit of a thread
///   other than the main one (`pid != tgid`). A thread-per-connection database (MySQL names
///   each new thread) makes two such events per connection, and glibc's set*id one per thread;
///   `parse_event` has no use for any of them;
/// - with `only`, the event types outside that `PROC_EVENT_*` mask. Linux 6.6 and later drop them
///   in the connector already (see `kernel_filters_events`); before that only this filter does.
///
/// Offsets are from the start of the netlink message: nlmsghdr (16) + cn_msg (20) + proc_event,
/// whose `what` is at 36 and its data at 52. Absolute loads read big-endian, so constants are
/// compared in that order (`be`). Anything shorter than a whole event, and the subscription's
/// acknowledgement (`what` = 0), passes untouched.
pub fn socket_filter(only: Option<u32>) -> Vec<libc::sock_filter> {
    const WHAT: u32 = (NLMSG_HDRLEN + CN_MSG_LEN) as u32;
    const DATA: u32 = WHAT + EVENT_HDR_LEN as u32;
    // fork: parent_pid, parent_tgid, child_pid, child_tgid; the others start with pid, tgid.
    const FORK_CHILD_PID: u32 = DATA + 8;
    const SHORTEST: u32 = FORK_CHILD_PID + 8;
    let be = |v: u32| u32::from_be_bytes(v.to_ne_bytes());
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let load = |off: u32| stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, off);
    let tax = stmt(libc::BPF_MISC | libc::BPF_TAX, 0);
    // Conditional jumps name their targets; they are resolved to offsets below.
    #[derive(Clone, Copy)]
    enum To {
        Next,
        Accept,
        Drop,
        ThreadCheck,
    }
    let mut prog: Vec<(libc::sock_filter, To, To)> = Vec::new();
    let jump = |code: u32, k: u32| stmt(libc::BPF_JMP | code, k);
    prog.push((
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_LEN, 0),
        To::Next,
        To::Next,
    ));
    prog.push((
        jump(libc::BPF_JGE | libc::BPF_K, SHORTEST),
        To::Next,
        To::Accept,
    ));
    prog.push((load(WHAT), To::Next, To::Next));
    prog.push((jump(libc::BPF_JEQ | libc::BPF_K, 0), To::Accept, To::Next));
    if let Some(mask) = only {
        prog.push((
            jump(libc::BPF_JSET | libc::BPF_K, be(mask)),
            To::Next,
            To::Drop,
        ));
    }
    prog.push((
        jump(libc::BPF_JEQ | libc::BPF_K, be(PROC_EVENT_FORK)),
        To::Next,
        To::ThreadCheck,
    ));
    // A fork: is the child a new thread group?
    prog.push((load(FORK_CHILD_PID + 4), To::Next, To::Next));
    prog.push((tax, To::Next, To::Next));
    prog.push((load(FORK_CHILD_PID), To::Next, To::Next));
    prog.push((jump(libc::BPF_JEQ | libc::BPF_X, 0), To::Accept, To::Drop));
    // Any other event: is it the main thread's?
    let thread_check = prog.len();
    prog.push((load(DATA + 4), To::Next, To::Next));
    prog.push((tax, To::Next, To::Next));
    prog.push((load(DATA), To::Next, To::Next));
    prog.push((jump(libc::BPF_JEQ | libc::BPF_X, 0), To::Accept, To::Drop));
    let accept = prog.len();
    prog.push((
        stmt(libc::BPF_RET | libc::BPF_K, u32::MAX),
        To::Next,
        To::Next,
    ));
    prog.push((stmt(libc::BPF_RET | libc::BPF_K, 0), To::Next, To::Next));
    let offset = |from: usize, to: To| -> u8 {
        let target = match to {
            To::Next => from + 1,
            To::Accept => accept,
            To::Drop => accept + 1,
            To::ThreadCheck => thread_check,
        };
        (target - from - 1) as u8
    };
    prog.iter()
        .enumerate()
        .map(|(i, (ins, jt, jf))| libc::sock_filter {
            jt: offset(i, *jt),
            jf: offset(i, *jf),
            ..*ins
        })
        .collect()
}

/// Attaches a classic BPF program to a socket (SO_ATTACH_FILTER).
pub fn attach_filter(fd: BorrowedFd<'_>, prog: &[libc::sock_filter]) -> io::Result<()> {
    // asm-generic/socket.h; the libc crate exports it for Android only.
    const SO_ATTACH_FILTER: libc::c_int = 26;
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // fprog points at prog, which outlives the call; the kernel copies the program.
    set_socket_option(fd, SO_ATTACH_FILTER, &fprog)
}

/// setsockopt(SOL_SOCKET, `opt`) with a plain-data value.
fn set_socket_option<T>(fd: BorrowedFd<'_>, opt: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: value is a valid T of the given size for the duration of the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            value as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What one read of the socket gave.
pub enum Received {
    Events,
    /// The socket's buffer overran: events were lost; the caller must rescan.
    Overrun,
    /// Nothing more to read now.
    Empty,
}

pub struct Connector {
    fd: OwnedFd,
    buf: Vec<u8>,
    filter: io::Result<()>,
    /// The connector itself sends only the `only` event types (Linux 6.6+).
    kernel_filtered: bool,
}

impl Connector {
    /// Opens the socket, subscribes to process events, and asks for a large receive buffer
    /// (SO_RCVBUFFORCE, root only; plain SO_RCVBUF otherwise) so bursts do not overrun it.
    /// Events of threads never arrive (see `socket_filter`). With `only`, only those event
    /// types arrive (a `PROC_EVENT_*` mask): the connector itself sends only those where
    /// `kernel_filters_events()` holds, and the socket filter drops the rest on older kernels.
    pub fn open(rcvbuf: usize, only: Option<u32>) -> io::Result<Connector> {
        // SAFETY: plain socket(2); the fd is owned below.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_CONNECTOR,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a new, valid descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = rcvbuf as libc::c_int;
        for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
            if set_socket_option(fd.as_fd(), opt, &size).is_ok() {
                break;
            }
        }
        // SAFETY: sockaddr_nl is plain data; zeroed is a valid value.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        addr.nl_groups = CN_IDX_PROC;
        // SAFETY: addr is a valid sockaddr_nl of the given size.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &addr as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // Subscribe: nlmsghdr + cn_msg + op (and the event mask: `struct proc_input`).
        // Older kernels ignore a subscription with a mask (`struct proc_input`) altogether.
        let kernel_mask = only.filter(|_| kernel_filters_events());
        let payload: u16 = if kernel_mask.is_some() { 8 } else { 4 };
        let total = NLMSG_HDRLEN + CN_MSG_LEN + payload as usize;
        let mut msg = Vec::with_capacity(total);
        msg.extend_from_slice(&(total as u32).to_ne_bytes());
        msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
        msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
        msg.extend_from_slice(&std::process::id().to_ne_bytes());
        msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
        msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
        msg.extend_from_slice(&0u32.to_ne_bytes()); // ack
        msg.extend_from_slice(&payload.to_ne_bytes()); // len
        msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
        msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
        if let Some(mask) = kernel_mask {
            msg.extend_from_slice(&mask.to_ne_bytes());
        }
        // SAFETY: msg is a valid buffer of msg.len() bytes.
        let r = unsafe {
            libc::send(
                fd.as_raw_fd(),
                msg.as_ptr() as *const libc::c_void,
                msg.len(),
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // Without the filter every event still arrives and is sorted out by `parse_event`: the
        // daemon only pays more for it, so a refusal is reported, not fatal.
        let filter = attach_filter(fd.as_fd(), &socket_filter(only));
        Ok(Connector {
            fd,
            buf: vec![0u8; 64 * 1024],
            filter,
            kernel_filtered: kernel_mask.is_some(),
        })
    }

    /// Whether the kernel's connector filters the event types itself (see `open`).
    pub fn kernel_filtered(&self) -> bool {
        self.kernel_filtered
    }

    /// Whether the socket filter that drops thread events (and, with `only`, unwanted types)
    /// was accepted, and the kernel's error if not.
    pub fn filter(&self) -> &io::Result<()> {
        &self.filter
    }

    /// Reads one datagram if one is queued (never blocks) and appends its events to `out`.
    pub fn receive(&mut self, out: &mut Vec<Timed>) -> io::Result<Received> {
        self.recv(out, libc::MSG_DONTWAIT)
    }

    /// Waits for the next datagram and appends its events to `out`: the daemon's event thread
    /// does nothing else, so one recv per datagram is all it costs (no poll, no EAGAIN read).
    pub fn wait_receive(&mut self, out: &mut Vec<Timed>) -> io::Result<Received> {
        self.recv(out, 0)
    }

    fn recv(&mut self, out: &mut Vec<Timed>, flags: libc::c_int) -> io::Result<Received> {
        // SAFETY: buf is a valid writable buffer of buf.len() bytes.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                self.buf.as_mut_ptr() as *mut libc::c_void,
                self.buf.len(),
                flags,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) => Ok(Received::Empty),
                Some(libc::ENOBUFS) => Ok(Received::Overrun),
                Some(libc::EINTR) => Ok(Received::Empty),
                _ => Err(e),
            };
        }
        parse_datagram(&self.buf[..n as usize], out);
        Ok(Received::Events)
    }
}

impl AsFd for Connector {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(what: u32, data: &[u32]) -> Vec<u8> {
        let mut ev = Vec::new();
        ev.extend_from_slice(&what.to_ne_bytes());
        ev.extend_from_slice(&0u32.to_ne_bytes()); // cpu
        ev.extend_from_slice(&(1000 + what as u64).to_ne_bytes()); // timestamp
        for d in data {
            ev.extend_from_slice(&d.to_ne_bytes());
        }
        let mut cn = Vec::new();
        cn.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
        cn.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
        cn.extend_from_slice(&[0u8; 8]);
        cn.extend_from_slice(&(ev.len() as u16).to_ne_bytes());
        cn.extend_from_slice(&0u16.to_ne_bytes());
        cn.extend_from_slice(&ev);
        let mut nl = Vec::new();
        nl.extend_from_slice(&((NLMSG_HDRLEN + cn.len()) as u32).to_ne_bytes());
        nl.extend_from_slice(&[0u8; 12]);
        nl.extend_from_slice(&cn);
        nl
    }

    #[test]
    fn parses_each_event_kind() {
        let mut out = Vec::new();
        parse_datagram(&datagram(PROC_EVENT_FORK, &[10, 10, 11, 11]), &mut out);
        parse_datagram(&datagram(PROC_EVENT_FORK, &[10, 10, 12, 10]), &mut out); // a thread
        parse_datagram(&datagram(PROC_EVENT_EXEC, &[11, 11]), &mut out);
        parse_datagram(&datagram(PROC_EVENT_UID, &[11, 11, 0, 1000]), &mut out);
        parse_datagram(
            &datagram(PROC_EVENT_COMM, &[11, 11, 0x6f72_615f, 0]),
            &mut out,
        );
        parse_datagram(
            &datagram(PROC_EVENT_EXIT, &[11, 11, 0, 17, 10, 10]),
            &mut out,
        );
        parse_datagram(&datagram(PROC_EVENT_NONE, &[0, 0, 0, 0]), &mut out);
        assert_eq!(out[0].kernel_ns, 1000 + PROC_EVENT_FORK as u64);
        let out: Vec<ProcEvent> = out.into_iter().map(|t| t.event).collect();
        assert_eq!(
            out,
            vec![
                ProcEvent::Fork {
                    parent: 10,
                    child: 11
                },
                ProcEvent::Other,
                ProcEvent::Exec { pid: 11 },
                ProcEvent::Ids { pid: 11 },
                ProcEvent::Comm { pid: 11 },
                ProcEvent::Exit { pid: 11 },
                ProcEvent::Acknowledgement,
            ]
        );
    }

    /// The socket filter run by the kernel itself: crafted events go through a datagram socket
    /// pair whose receiving end carries the filter (AF_UNIX runs socket filters as netlink does),
    /// and the test checks which ones arrive.
    #[test]
    fn the_socket_filter_drops_thread_events_and_unwanted_types() {
        use std::os::unix::net::UnixDatagram;
        const PROC_EVENT_PTRACE: u32 = 0x100;
        // A whole event, as the kernel sends it (its data padded to the union's 24 bytes).
        let event = |what: u32, data: &[u32]| {
            let mut d = data.to_vec();
            d.resize(6, 0);
            datagram(what, &d)
        };
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "fork of a process",
                event(PROC_EVENT_FORK, &[10, 10, 11, 11]),
            ),
            (
                "fork of a thread",
                event(PROC_EVENT_FORK, &[10, 10, 12, 10]),
            ),
            ("exec", event(PROC_EVENT_EXEC, &[11, 11])),
            (
                "uid of a process",
                event(PROC_EVENT_UID, &[11, 11, 0, 1000]),
            ),
            ("uid of a thread", event(PROC_EVENT_UID, &[12, 11, 0, 1000])),
            (
                "gid of a process",
                event(PROC_EVENT_GID, &[11, 11, 0, 1000]),
            ),
            (
                "comm of a process",
                event(PROC_EVENT_COMM, &[11, 11, 0x6f72_615f]),
            ),
            (
                "comm of a thread",
                event(PROC_EVENT_COMM, &[12, 11, 0x6f72_615f]),
            ),
            (
                "exit of a process",
                event(PROC_EVENT_EXIT, &[11, 11, 0, 17, 10, 10]),
            ),
            (
                "exit of a thread",
                event(PROC_EVENT_EXIT, &[12, 11, 0, 0, 10, 10]),
            ),
            ("ptrace", event(PROC_EVENT_PTRACE, &[11, 11, 1, 1])),
            ("acknowledgement", event(0, &[0])),
            ("short message", datagram(PROC_EVENT_FORK, &[10])),
        ];
        let arrived = |only: Option<u32>| -> Vec<&str> {
            let (tx, rx) = UnixDatagram::pair().expect("socketpair");
            attach_filter(rx.as_fd(), &socket_filter(only)).expect("SO_ATTACH_FILTER");
            rx.set_nonblocking(true).unwrap();
            for (_, d) in &cases {
                tx.send(d).expect("send");
            }
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            while let Ok(n) = rx.recv(&mut buf) {
                let (name, _) = cases
                    .iter()
                    .find(|(_, d)| d[..] == buf[..n])
                    .expect("an event that was sent");
                got.push(*name);
            }
            got
        };
        assert_eq!(
            arrived(None),
            vec![
                "fork of a process",
                "exec",
                "uid of a process",
                "gid of a process",
                "comm of a process",
                "exit of a process",
                "ptrace",
                "acknowledgement",
                "short message"
            ]
        );
        assert_eq!(
            arrived(Some(DAEMON_EVENTS)),
            vec![
                "fork of a process",
                "exec",
                "uid of a process",
                "gid of a process",
                "comm of a process",
                "acknowledgement",
                "short message"
            ]
        );
    }

    #[test]
    fn kernel_release_versions() {
        assert_eq!(parse_release("6.18.0-1-amd64\n"), Some((6, 18)));
        assert_eq!(parse_release("6.1.0-26-amd64"), Some((6, 1)));
        assert_eq!(
            parse_release("5.15.167.4-microsoft-standard-WSL2"),
            Some((5, 15))
        );
        assert_eq!(parse_release("garbage"), None);
        assert!((6, 6) > (5, 19) && (6, 18) >= (6, 6) && (6, 1) < (6, 6));
    }

    #[test]
    fn truncated_datagrams_are_ignored() {
        let d = datagram(PROC_EVENT_EXEC, &[11, 11]);
        let mut out = Vec::new();
        parse_datagram(&d[..d.len() - 6], &mut out);
        parse_datagram(&d[..10], &mut out);
        assert!(out.is_empty());
    }
}
