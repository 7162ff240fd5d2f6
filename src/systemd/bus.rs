//! The systemd manager on the system bus (org.freedesktop.systemd1(5)), through zbus's blocking
//! API: no async runtime of dbcage's own. zbus runs its connection on one internal executor
//! thread it spawns, and async-io adds its reactor thread when a wait needs a timer; job waits
//! below run on the caller's thread with `async_io::block_on`.
//!
//! Every error names the unit, the properties of the call and systemd's error name and message,
//! so the user sees `org.freedesktop.systemd1.NoSuchUnit: Unit x.service not loaded.` with context.

use std::collections::HashMap;
use std::time::Duration;

use futures_lite::StreamExt;
use zbus::zvariant::{OwnedObjectPath, OwnedValue, Value};

use super::props::{Property, UnitResources};

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = true
)]
trait Manager {
    fn subscribe(&self) -> zbus::Result<()>;
    #[zbus(name = "GetUnitByPID")]
    fn get_unit_by_pid(&self, pid: u32) -> zbus::Result<OwnedObjectPath>;
    fn get_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &[(&str, Value<'_>)],
    ) -> zbus::Result<()>;
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Value<'_>)],
        aux: &[(&str, &[(&str, Value<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;
    fn reload(&self) -> zbus::Result<()>;
    fn get_unit_processes(&self, name: &str) -> zbus::Result<Vec<(String, u32, String)>>;
    fn attach_processes_to_unit(
        &self,
        unit_name: &str,
        subcgroup: &str,
        pids: &[u32],
    ) -> zbus::Result<()>;
    #[zbus(signal)]
    fn job_removed(&self, id: u32, job: OwnedObjectPath, unit: String, result: String);
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "cannot connect to systemd on the system bus ({source}); is dbus running \
         (/run/dbus/system_bus_socket)? Set agent.manager = \"cgroupfs\" to run without systemd"
    )]
    Connect {
        #[source]
        source: zbus::Error,
    },
    #[error("systemd {method} of {unit}{}: {name}: {message}", properties_note(.properties))]
    Call {
        method: &'static str,
        unit: String,
        /// The properties of the call, as `Name=value` (empty for calls without properties).
        properties: Vec<String>,
        /// systemd's (or the bus's) error name, e.g. `org.freedesktop.systemd1.NoSuchUnit`.
        name: String,
        message: String,
    },
    #[error("systemd unit {unit}: property {property}: {why}")]
    Property {
        unit: String,
        property: &'static str,
        why: String,
    },
    #[error(
        "systemd unit {unit}: cannot remove the runtime drop-in {}: {source}; remove it by hand \
         and run `systemctl daemon-reload` to give {unit} its own settings back",
        .path.display()
    )]
    Dropin {
        unit: String,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "systemd job {job} ({method} of {unit}) finished with result `{result}`; \
         see `journalctl -u {unit}`"
    )]
    Job {
        method: &'static str,
        unit: String,
        job: String,
        result: String,
    },
    #[error(
        "systemd job {job} ({method} of {unit}) did not finish within {waited:?}; \
         see `systemctl list-jobs`"
    )]
    Timeout {
        method: &'static str,
        unit: String,
        job: String,
        waited: Duration,
    },
}

fn properties_note(properties: &[String]) -> String {
    if properties.is_empty() {
        String::new()
    } else {
        format!(" (setting {})", properties.join(", "))
    }
}

impl Error {
    fn call(method: &'static str, unit: &str, properties: &[String], e: zbus::Error) -> Self {
        let (name, message) = match &e {
            zbus::Error::MethodError(name, message, _) => {
                (name.to_string(), message.clone().unwrap_or_default())
            }
            zbus::Error::FDO(fdo) => {
                let full = fdo.to_string();
                match full.split_once(": ") {
                    Some((n, m)) => (n.to_string(), m.to_string()),
                    None => ("org.freedesktop.DBus.Error".into(), full),
                }
            }
            other => ("zbus".into(), other.to_string()),
        };
        Error::Call {
            method,
            unit: unit.to_string(),
            properties: properties.to_vec(),
            name,
            message,
        }
    }

    /// systemd's error name, for callers that react to one (`NoSuchUnit`).
    pub fn systemd_name(&self) -> Option<&str> {
        match self {
            Error::Call { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// A transient scope that adopts processes started outside systemd.
#[derive(Debug, Clone)]
pub struct ScopeSpec {
    /// `dbcage-<tenant>.scope` (see `super::scope_name`).
    pub name: String,
    pub slice: String,
    pub description: String,
    pub pids: Vec<u32>,
    /// Delegate=yes: dbcage may create leaves and write cgroup files below the scope.
    pub delegate: bool,
    /// Resource properties set at creation (the tenant's limits).
    pub properties: Vec<Property>,
}

/// A connection to the systemd manager.
pub struct Systemd {
    conn: zbus::blocking::Connection,
    manager: ManagerProxyBlocking<'static>,
    /// The same proxy's async side, for job waits (a signal stream raced against a timer).
    manager_async: ManagerProxy<'static>,
    /// How long a job (start, stop) may take before the call fails.
    pub job_timeout: Duration,
}

impl Systemd {
    /// Connects to the system bus and subscribes to the manager's signals (systemd emits
    /// `JobRemoved` only while some client is subscribed).
    pub fn connect() -> Result<Self, Error> {
        let conn =
            zbus::blocking::Connection::system().map_err(|source| Error::Connect { source })?;
        let manager =
            ManagerProxyBlocking::new(&conn).map_err(|source| Error::Connect { source })?;
        manager
            .subscribe()
            .map_err(|e| Error::call("Subscribe", "-", &[], e))?;
        let manager_async = ManagerProxy::from(manager.inner().inner().clone());
        Ok(Systemd {
            conn,
            manager,
            manager_async,
            job_timeout: Duration::from_secs(30),
        })
    }

    /// The unit systemd accounts a process to (GetUnitByPID), by name.
    pub fn unit_by_pid(&self, pid: u32) -> Result<String, Error> {
        let label = format!("pid {pid}");
        let path = self
            .manager
            .get_unit_by_pid(pid)
            .map_err(|e| Error::call("GetUnitByPID", &label, &[], e))?;
        let props = self.get_all(&label, &path, "org.freedesktop.systemd1.Unit")?;
        match props.get("Id").map(|v| &**v) {
            Some(Value::Str(s)) => Ok(s.to_string()),
            other => Err(Error::Property {
                unit: label,
                property: "Id",
                why: format!("expected a string, got {other:?}"),
            }),
        }
    }

    /// The unit's resource properties (the unit must be loaded).
    pub fn unit_resources(&self, unit: &str) -> Result<UnitResources, Error> {
        let iface = type_interface(unit).ok_or_else(|| Error::Property {
            unit: unit.to_string(),
            property: "Id",
            why: "not a unit type with a cgroup (.service, .scope, .slice, .socket, .mount, .swap)"
                .into(),
        })?;
        let path = self
            .manager
            .get_unit(unit)
            .map_err(|e| Error::call("GetUnit", unit, &[], e))?;
        let props = self.get_all(unit, &path, iface)?;
        UnitResources::from_properties(&props).map_err(|b| Error::Property {
            unit: unit.to_string(),
            property: b.property,
            why: b.why,
        })
    }

    /// Sets properties at runtime (`systemctl set-property --runtime`: a drop-in under
    /// /run/systemd/system.control/, gone at reboot). systemd checks every property before it
    /// applies any, so a refused call changes nothing.
    pub fn set_properties(&self, unit: &str, props: &[Property]) -> Result<(), Error> {
        if props.is_empty() {
            return Ok(());
        }
        let shown: Vec<String> = props.iter().map(Property::to_string).collect();
        let sent: Vec<Property> = props.iter().flat_map(Property::assignments).collect();
        let values: Vec<(&str, Value<'_>)> =
            sent.iter().map(|p| (p.name(), p.to_value())).collect();
        self.manager
            .set_unit_properties(unit, true, &values)
            .map_err(|e| Error::call("SetUnitProperties", unit, &shown, e))
    }

    /// Starts a transient scope holding `spec.pids` and waits for its job to finish. The
    /// JobRemoved subscription is made before the call, so a fast job cannot be missed.
    pub fn start_scope(&self, spec: &ScopeSpec) -> Result<(), Error> {
        let mut values: Vec<(&str, Value<'_>)> = vec![
            ("Description", Value::from(spec.description.as_str())),
            ("Slice", Value::from(spec.slice.as_str())),
            ("PIDs", Value::from(spec.pids.clone())),
            ("Delegate", Value::Bool(spec.delegate)),
        ];
        values.extend(spec.properties.iter().map(|p| (p.name(), p.to_value())));
        let shown: Vec<String> = spec.properties.iter().map(Property::to_string).collect();
        let name = spec.name.as_str();
        let call = self
            .manager_async
            .start_transient_unit(name, "fail", &values, &[]);
        self.run_job("StartTransientUnit", name, &shown, call)
    }

    /// Stops a unit and waits for the job. For a scope this signals its processes (systemd's
    /// KillMode); dbcage stops only its own scopes, and only when they are empty or on request.
    pub fn stop_unit(&self, unit: &str) -> Result<(), Error> {
        let call = self.manager_async.stop_unit(unit, "replace");
        self.run_job("StopUnit", unit, &[], call)
    }

    /// Moves processes into a running unit's cgroup (AttachProcessesToUnit; systemd >= 238),
    /// e.g. a tenant's new processes into its existing scope. `subcgroup` is a path below the
    /// unit's cgroup (`""` for the unit's own; a subgroup needs Delegate=yes).
    pub fn attach(&self, unit: &str, subcgroup: &str, pids: &[u32]) -> Result<(), Error> {
        let mut shown = vec![format!("PIDs={pids:?}")];
        if !subcgroup.is_empty() {
            shown.push(format!("subgroup={subcgroup}"));
        }
        self.manager
            .attach_processes_to_unit(unit, subcgroup, pids)
            .map_err(|e| Error::call("AttachProcessesToUnit", unit, &shown, e))
    }

    /// Every process of a unit, its subgroups included (GetUnitProcesses).
    pub fn unit_pids(&self, unit: &str) -> Result<Vec<u32>, Error> {
        let procs = self
            .manager
            .get_unit_processes(unit)
            .map_err(|e| Error::call("GetUnitProcesses", unit, &[], e))?;
        Ok(procs.into_iter().map(|(_, pid, _)| pid).collect())
    }

    /// Reloads the manager's configuration (`systemctl daemon-reload`): every unit's files and
    /// drop-ins are read again. systemd answers once the reload is done.
    pub fn reload(&self) -> Result<(), Error> {
        self.manager
            .reload()
            .map_err(|e| Error::call("Reload", "-", &[], e))
    }

    /// Forgets a unit's failed state (so a scope of the same name can be started again).
    pub fn reset_failed(&self, unit: &str) -> Result<(), Error> {
        self.manager
            .reset_failed_unit(unit)
            .map_err(|e| Error::call("ResetFailedUnit", unit, &[], e))
    }

    fn get_all(
        &self,
        unit: &str,
        path: &OwnedObjectPath,
        iface: &'static str,
    ) -> Result<HashMap<String, OwnedValue>, Error> {
        let call = |e: zbus::Error| Error::call("GetAll", unit, &[], e);
        let props = zbus::blocking::fdo::PropertiesProxy::builder(&self.conn)
            .destination("org.freedesktop.systemd1")
            .and_then(|b| b.path(path.clone()))
            .and_then(|b| b.build())
            .map_err(call)?;
        let iface = zbus::names::InterfaceName::from_static_str(iface)
            .map_err(|e| call(zbus::Error::from(e)))?;
        props
            .get_all(iface)
            .map_err(|e| Error::call("GetAll", unit, &[], e.into()))
    }

    /// Runs a job-returning call and waits for its JobRemoved signal, up to `job_timeout`.
    /// `call` is not yet polled (futures are lazy): the signal match is in place before the
    /// method call leaves.
    fn run_job(
        &self,
        method: &'static str,
        unit: &str,
        shown: &[String],
        call: impl std::future::Future<Output = zbus::Result<OwnedObjectPath>>,
    ) -> Result<(), Error> {
        let manager = &self.manager_async;
        async_io::block_on(async {
            let mut removed = manager
                .receive_job_removed()
                .await
                .map_err(|e| Error::call("AddMatch(JobRemoved)", unit, &[], e))?;
            let job = call
                .await
                .map_err(|e| Error::call(method, unit, shown, e))?;
            let wait = async {
                while let Some(signal) = removed.next().await {
                    let Ok(args) = signal.args() else { continue };
                    if args.job.as_str() == job.as_str() {
                        return Some(args.result.clone());
                    }
                }
                None
            };
            let timeout = async {
                async_io::Timer::after(self.job_timeout).await;
                None
            };
            let job_name = job.to_string();
            match futures_lite::future::or(wait, timeout).await {
                Some(result) if result == "done" => Ok(()),
                Some(result) => Err(Error::Job {
                    method,
                    unit: unit.to_string(),
                    job: job_name,
                    result,
                }),
                None => Err(Error::Timeout {
                    method,
                    unit: unit.to_string(),
                    job: job_name,
                    waited: self.job_timeout,
                }),
            }
        })
    }
}

/// The D-Bus interface that holds a unit type's resource-control properties.
fn type_interface(unit: &str) -> Option<&'static str> {
    let (_, suffix) = unit.rsplit_once('.')?;
    Some(match suffix {
        "service" => "org.freedesktop.systemd1.Service",
        "scope" => "org.freedesktop.systemd1.Scope",
        "slice" => "org.freedesktop.systemd1.Slice",
        "socket" => "org.freedesktop.systemd1.Socket",
        "mount" => "org.freedesktop.systemd1.Mount",
        "swap" => "org.freedesktop.systemd1.Swap",
        _ => return None,
    })
}
