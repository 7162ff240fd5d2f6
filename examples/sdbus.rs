//! A thin command line over `dbcage::systemd`, for the guest tests in tests/sdguest/guest/ (they
//! check every call against `systemctl show` and the kernel's files), and for looking at a host:
//!
//! ```text
//! sdbus unit-of PID                  GetUnitByPID and /proc/PID/cgroup's unit
//! sdbus show UNIT                    the unit's resource properties (Name=value lines)
//! sdbus set UNIT Name=value...       SetUnitProperties(runtime=true)
//! sdbus scope TENANT PID... [-- Name=value...]   StartTransientUnit dbcage-TENANT.scope
//! sdbus stop UNIT | reset-failed UNIT
//! sdbus assert UNIT Name=value...    govern::assert_unit: prints each repaired property
//! sdbus adopt TENANT PID... [-- Name=value...]   govern::adopt (start or attach)
//! sdbus release UNIT Name=value...   govern::release: their runtime drop-ins removed and a reload
//!                                    (a dbcage scope: those properties back to defaults)
//! sdbus threads                      the threads of this process after connecting
//! sdbus detect                       whether systemd is the cgroup manager
//! ```
//! Build: `cargo build --example sdbus`.

use std::process::ExitCode;

use dbcage::hostfs::HostFs;
use dbcage::systemd::{self, govern, Property, ScopeSpec, Systemd};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sdbus: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn props(args: &[String]) -> anyhow::Result<Vec<Property>> {
    args.iter()
        .map(|a| a.parse::<Property>().map_err(anyhow::Error::msg))
        .collect()
}

fn run(args: &[String]) -> anyhow::Result<()> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["detect"] => {
            println!("systemd={}", systemd::is_cgroup_manager(&HostFs::default()));
        }
        ["unit-of", pid] => {
            let pid: u32 = pid.parse()?;
            let sd = Systemd::connect()?;
            println!("bus={}", sd.unit_by_pid(pid)?);
            let proc = systemd::unit_of_pid(&HostFs::default(), pid)?;
            println!("proc={}", proc.unwrap_or_else(|| "-".into()));
        }
        ["show", unit] => {
            let r = Systemd::connect()?.unit_resources(unit)?;
            println!("ControlGroup={}", r.control_group);
            let all = [
                Property::CpuQuotaPerSecUSec(None),
                Property::CpuWeight(None),
                Property::AllowedCpus(Default::default()),
                Property::AllowedMemoryNodes(Default::default()),
                Property::MemoryMax(None),
                Property::MemoryHigh(None),
                Property::MemoryLow(None),
                Property::MemorySwapMax(None),
                Property::IoReadBandwidthMax(vec![]),
                Property::IoWriteBandwidthMax(vec![]),
                Property::IoReadIopsMax(vec![]),
                Property::IoWriteIopsMax(vec![]),
                Property::Delegate(false),
            ];
            for p in all {
                println!("{}", r.current(&p));
            }
        }
        ["set", unit, rest @ ..] => {
            let p = props(args.get(2..).unwrap_or_default())?;
            anyhow::ensure!(!rest.is_empty(), "set UNIT Name=value...");
            Systemd::connect()?.set_properties(unit, &p)?;
        }
        ["scope", tenant, rest @ ..] => {
            let split = rest.iter().position(|w| *w == "--").unwrap_or(rest.len());
            let pids = rest[..split]
                .iter()
                .map(|p| p.parse::<u32>())
                .collect::<Result<Vec<_>, _>>()?;
            let properties = props(&args[2 + (split + 1).min(rest.len())..])?;
            let spec = ScopeSpec {
                name: systemd::scope_name(tenant),
                slice: systemd::SLICE.into(),
                description: format!("dbcage tenant {tenant}"),
                pids,
                delegate: true,
                properties,
            };
            let t0 = std::time::Instant::now();
            Systemd::connect()?.start_scope(&spec)?;
            println!("started {} in {:?}", spec.name, t0.elapsed());
        }
        ["stop", unit] => Systemd::connect()?.stop_unit(unit)?,
        ["assert", unit, ..] => {
            let repaired = govern::assert_unit(&Systemd::connect()?, unit, &props(&args[2..])?)?;
            for (want, was) in &repaired {
                println!("repaired {want} (was {was})");
            }
            println!("repairs={}", repaired.len());
        }
        ["adopt", tenant, rest @ ..] => {
            let split = rest.iter().position(|w| *w == "--").unwrap_or(rest.len());
            let pids = rest[..split]
                .iter()
                .map(|p| p.parse::<u32>())
                .collect::<Result<Vec<_>, _>>()?;
            let properties = props(&args[2 + (split + 1).min(rest.len())..])?;
            let how = govern::adopt(&Systemd::connect()?, tenant, &pids, "", &properties)?;
            println!("adopted={how:?}");
        }
        ["release", unit, ..] => {
            let sd = Systemd::connect()?;
            let fs = HostFs::default();
            let how = govern::release(&sd, &fs, unit, &props(&args[2..])?)?;
            if matches!(&how, govern::Released::DropinsRemoved(f) if !f.is_empty()) {
                sd.reload()?;
            }
            println!("released={how:?}");
        }
        ["reset-failed", unit] => Systemd::connect()?.reset_failed(unit)?,
        ["threads"] => {
            let before = threads()?;
            let sd = Systemd::connect()?;
            // A job wait is what brings async-io's reactor in (its timer).
            let _ = sd.stop_unit("dbcage-sdbus-nonexistent.scope");
            println!("before={}", before.join(","));
            println!("after={}", threads()?.join(","));
        }
        _ => anyhow::bail!("usage: see the header of examples/sdbus.rs"),
    }
    Ok(())
}

fn threads() -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for t in std::fs::read_dir("/proc/self/task")? {
        let comm = std::fs::read_to_string(t?.path().join("comm"))?;
        names.push(comm.trim().to_string());
    }
    names.sort();
    Ok(names)
}
