//! The service context: the connection to the daemon.

use std::fmt;
use std::path::PathBuf;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use urom_contract::default_service_socket;

use std::net::{IpAddr, SocketAddr};

use super::control::{ControlChannel, ControlError, RemoteService};
use super::engine::OneShot;
use super::service_file::{SERVICE_FILE_VAR, ServiceFileError, lookup_service};
use super::{Idle, ProgressEngine, Running, State};
use urom_transport::auth::{KEY_FILE_VAR, KeyFileError, SharedSecret};
use urom_transport::stream::{self, StreamReader, StreamWriter};
use urom_transport::{Channel, ChannelConfig, ConnectError};
use urom_wire::control::ControlMessage;
use urom_wire::{CpuSet, MaxMsgSize, MaxMsgSizeError};

/// A plugin the service offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePlugin {
    /// Its id, for command tasks and worker plugin masks.
    pub id: u64,
    /// Its version; the host side checks it.
    pub version: u64,
    /// Its name (`worker_graph`, ...).
    pub name: String,
}

/// Why a service did not start.
#[derive(Debug)]
pub enum ServiceStartError {
    /// The service file did not name a service for this host.
    ServiceFile(ServiceFileError),
    /// The service file names a service on another machine, which needs the `ucx` feature.
    Remote {
        /// The service's host.
        dev_hostname: String,
    },
    /// The key file for a remote service cannot be used.
    KeyFile(KeyFileError),
    /// The remote service cannot be reached.
    Connect(ConnectError),
    /// Talking to the daemon failed.
    Control(ControlError),
}

impl fmt::Display for ServiceStartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ServiceFile(e) => write!(f, "{e}"),
            Self::Remote { dev_hostname } => write!(
                f,
                "the service runs on {dev_hostname}; reaching another machine needs the ucx transport, not built in"
            ),
            Self::KeyFile(e) => write!(f, "{e}"),
            Self::Connect(e) => write!(f, "cannot reach the service: {e}"),
            Self::Control(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ServiceStartError {}

/// Settings of an idle service.
#[derive(Debug, Clone)]
struct Config {
    max_msg_size: MaxMsgSize,
    max_workers: usize,
    socket: Option<PathBuf>,
    service_file: Option<PathBuf>,
    device_pci: Option<String>,
    identity: String,
    /// The service on another machine, `HOST:PORT`.
    remote: Option<String>,
    key_file: Option<PathBuf>,
}

/// What a running service shares with its workers, on any thread.
pub(crate) struct Shared {
    pub(crate) channel: Arc<ControlChannel>,
    pub(crate) max_msg_size: MaxMsgSize,
    plugins: Vec<ServicePlugin>,
    cpuset: CpuSet,
    max_workers: usize,
    /// Worker contexts started through this service and not yet stopped, failed or dropped.
    workers: AtomicUsize,
}

impl Shared {
    /// One of the service's `max_workers` places, or `None` when all are taken.
    pub(crate) fn take_worker_slot(self: &Arc<Self>) -> Option<WorkerSlot> {
        self.workers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_workers).then_some(n + 1)
            })
            .ok()?;
        Some(WorkerSlot(Arc::clone(self)))
    }

    pub(crate) fn max_workers(&self) -> usize {
        self.max_workers
    }

    /// The plugins the service offers.
    pub(crate) fn plugins(&self) -> &[ServicePlugin] {
        &self.plugins
    }
}

/// A worker context's place among its service's `max_workers`; given back when dropped.
pub(crate) struct WorkerSlot(Arc<Shared>);

impl Drop for WorkerSlot {
    fn drop(&mut self) {
        self.0.workers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The port a remote service listens on when its address names none: `urom-daemon
/// --listen-ucx 0.0.0.0:13340`.
pub const DEFAULT_REMOTE_PORT: u16 = 13340;

/// Where a service is.
enum ServiceAt {
    /// On this machine, at this socket.
    Local(PathBuf),
    /// On another machine.
    Remote {
        /// `HOST[:PORT]`.
        address: String,
        /// The network devices the service file names for it (`UCX_NET_DEVICES`).
        net_devices: Vec<String>,
    },
}

/// `host` with [`DEFAULT_REMOTE_PORT`] unless it names a port (`host:port`, `[v6]:port`).
fn with_default_port(host: &str) -> String {
    let has_port = if host.starts_with('[') {
        host.contains("]:")
    } else {
        host.matches(':').count() == 1
    };
    match (has_port, host.parse::<std::net::Ipv6Addr>()) {
        (_, Ok(v6)) => format!("[{v6}]:{DEFAULT_REMOTE_PORT}"),
        (true, _) => host.to_owned(),
        (false, _) => format!("{host}:{DEFAULT_REMOTE_PORT}"),
    }
}

/// The first address `address` (`HOST:PORT`) resolves to.
fn resolve(address: &str) -> Result<SocketAddr, ServiceStartError> {
    use std::net::ToSocketAddrs;
    let unreachable = |source: std::io::Error| {
        ServiceStartError::Control(ControlError::io(
            format!("resolving the service's address {address}"),
            source,
        ))
    };
    address
        .to_socket_addrs()
        .map_err(unreachable)?
        .next()
        .ok_or_else(|| {
            unreachable(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "it resolves to no address",
            ))
        })
}

/// What a running service holds besides its settings.
pub struct Connected {
    /// The connection and what the daemon said, shared with the service's workers.
    shared: Arc<Shared>,
}

/// The connection to the urom service.
pub struct Service<S: State> {
    config: Box<Config>,
    /// Nothing when idle; the connection when running.
    data: S::Service,
}

/// Called when a workers-by-gid query completes: the ids, or why it failed.
pub type GidCallback = fn(gid: u32, result: Result<&[u64], &ControlError>);

impl Default for Service<Idle> {
    fn default() -> Self {
        Self::new()
    }
}

impl Service<Idle> {
    /// A service with default settings: 4096-byte messages, 64 workers, the socket from
    /// `DOCA_UROM_SERVICE_FILE` when set, else the default socket.
    pub fn new() -> Self {
        Self {
            config: Box::new(Config {
                max_msg_size: MaxMsgSize::DEFAULT,
                max_workers: 64,
                socket: None,
                service_file: std::env::var_os(SERVICE_FILE_VAR).map(PathBuf::from),
                device_pci: None,
                identity: format!("pid {}", std::process::id()),
                remote: None,
                key_file: std::env::var_os(KEY_FILE_VAR).map(PathBuf::from),
            }),
            data: (),
        }
    }

    /// The channels' largest message, header included; the daemon must use the same.
    pub fn set_max_msg_size(mut self, bytes: u32) -> Result<Self, MaxMsgSizeError> {
        self.config.max_msg_size = MaxMsgSize::new(bytes)?;
        Ok(self)
    }

    /// The most worker contexts this host runs through the service at once (default 64); a
    /// power of two. Starting one more fails with [`WorkerStartError::TooManyWorkers`] until
    /// one is stopped or dropped, or fails to start.
    ///
    /// [`WorkerStartError::TooManyWorkers`]: super::WorkerStartError::TooManyWorkers
    pub fn set_max_workers(mut self, workers: usize) -> Result<Self, Self> {
        if !workers.is_power_of_two() {
            return Err(self);
        }
        self.config.max_workers = workers;
        Ok(self)
    }

    /// The daemon's socket, overriding the service file.
    pub fn set_socket(mut self, socket: impl Into<PathBuf>) -> Self {
        self.config.socket = Some(socket.into());
        self
    }

    /// The service file to look this host up in.
    pub fn set_service_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.service_file = Some(path.into());
        self
    }

    /// The PCI address of the device whose service to use (for hosts with several).
    pub fn set_device_pci(mut self, pci: impl Into<String>) -> Self {
        self.config.device_pci = Some(pci.into());
        self
    }

    /// A service on another machine, `HOST:PORT` (an IP address, or a name the resolver
    /// knows), reached over UCX and authenticated with the key file; overrides the socket and
    /// the service file.
    pub fn set_remote(mut self, address: impl Into<String>) -> Self {
        self.config.remote = Some(address.into());
        self
    }

    /// The file holding the secret shared with a remote service [default: `$UROM_KEY_FILE`].
    pub fn set_key_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.key_file = Some(path.into());
        self
    }

    /// How this host introduces itself in the daemon's log; a remote service knows the host
    /// by it: its workers are this identity's.
    pub fn set_identity(mut self, identity: impl Into<String>) -> Self {
        self.config.identity = identity.into();
        self
    }

    /// Connects and authenticates, then reads the plugins and the CPU set.
    pub fn start(self) -> Result<Service<Running>, (Self, ServiceStartError)> {
        let connected = self.connect().and_then(|channel| self.query(channel));
        self.running(connected)
    }

    /// Starts on a channel already connected to a service (a transport of the caller's
    /// choosing), authenticating with the key file as a remote host does.
    pub fn start_on(self, channel: Channel) -> Result<Service<Running>, (Self, ServiceStartError)> {
        let connected = self
            .open_remote(stream::split_channel(channel), None)
            .and_then(|channel| self.query(channel));
        self.running(connected)
    }

    fn running(
        self,
        connected: Result<Shared, ServiceStartError>,
    ) -> Result<Service<Running>, (Self, ServiceStartError)> {
        match connected {
            Ok(shared) => Ok(Service {
                config: self.config,
                data: Connected {
                    shared: Arc::new(shared),
                },
            }),
            Err(error) => Err((self, error)),
        }
    }

    /// Authenticates on a connected stream with the shared secret, to a service at `ip` when
    /// known.
    fn open_remote(
        &self,
        (reader, writer): (StreamReader, StreamWriter),
        ip: Option<IpAddr>,
    ) -> Result<Arc<ControlChannel>, ServiceStartError> {
        let key_file = self.config.key_file.as_deref().ok_or_else(|| {
            ServiceStartError::KeyFile(KeyFileError::Unreadable {
                path: PathBuf::from(format!("${KEY_FILE_VAR}")),
                reason: "no key file given: a remote service needs one".into(),
            })
        })?;
        let secret = SharedSecret::read(key_file).map_err(ServiceStartError::KeyFile)?;
        ControlChannel::open(
            reader,
            writer,
            self.config.max_msg_size,
            &self.config.identity,
            Some(RemoteService {
                secret: &secret,
                ip,
            }),
        )
        .map_err(ServiceStartError::Control)
    }

    /// Where the service is: the socket or remote address set, else the service file's line
    /// for this host, else the default socket.
    fn locate(&self) -> Result<ServiceAt, ServiceStartError> {
        if let Some(address) = &self.config.remote {
            return Ok(ServiceAt::Remote {
                address: address.clone(),
                net_devices: Vec::new(),
            });
        }
        if let Some(socket) = &self.config.socket {
            return Ok(ServiceAt::Local(socket.clone()));
        }
        if let Some(file) = &self.config.service_file {
            let hostname = nix::unistd::gethostname()
                .ok()
                .and_then(|name| name.into_string().ok())
                .unwrap_or_default();
            let line = lookup_service(file, &hostname, self.config.device_pci.as_deref())
                .map_err(ServiceStartError::ServiceFile)?;
            let local = [hostname.as_str(), "localhost", "127.0.0.1", "::1"];
            if !local.contains(&line.dev_hostname.as_str()) {
                return Ok(ServiceAt::Remote {
                    address: with_default_port(&line.dev_hostname),
                    net_devices: line.net_devs,
                });
            }
        }
        Ok(ServiceAt::Local(default_service_socket()))
    }

    /// The daemon's socket this service would connect to: the one set, else the one the
    /// service file names for this host (a local service), else the default socket. A service
    /// on another machine has none: [`ServiceStartError::Remote`].
    pub fn resolve_socket(&self) -> Result<PathBuf, ServiceStartError> {
        match self.locate()? {
            ServiceAt::Local(socket) => Ok(socket),
            ServiceAt::Remote { address, .. } => Err(ServiceStartError::Remote {
                dev_hostname: address,
            }),
        }
    }

    fn connect(&self) -> Result<Arc<ControlChannel>, ServiceStartError> {
        match self.locate()? {
            ServiceAt::Local(socket) => {
                ControlChannel::connect(&socket, self.config.max_msg_size, &self.config.identity)
                    .map_err(ServiceStartError::Control)
            }
            ServiceAt::Remote {
                address,
                net_devices,
            } => {
                if !cfg!(feature = "ucx") {
                    return Err(ServiceStartError::Remote {
                        dev_hostname: address,
                    });
                }
                // The service file's devices, unless UCX_NET_DEVICES says otherwise.
                #[cfg(feature = "ucx")]
                if !net_devices.is_empty() {
                    let devices = net_devices.join(",");
                    urom_transport::ucx::set_config_defaults(&[("NET_DEVICES", &devices)]);
                }
                let _ = net_devices;
                let resolved = resolve(&address)?;
                let timeout = ChannelConfig::new(self.config.max_msg_size).handshake_timeout;
                let halves = stream::connect_tcp(resolved, timeout).map_err(|e| {
                    ServiceStartError::Control(ControlError::io(
                        format!(
                            "connecting to {resolved} (is urom-daemon --listen-ucx running \
                             there, and does the network let this host reach that port?)"
                        ),
                        e,
                    ))
                })?;
                self.open_remote(halves, Some(resolved.ip()))
            }
        }
    }

    /// Reads the plugins and the CPU set.
    fn query(&self, channel: Arc<ControlChannel>) -> Result<Shared, ServiceStartError> {
        let max = self.config.max_msg_size;
        let reply = channel
            .call(ControlMessage::PluginListRequest)
            .map_err(ServiceStartError::Control)?;
        let plugins = match reply.message() {
            ControlMessage::PluginListReply(list) => list
                .iter()
                .map(|p| ServicePlugin {
                    id: p.id,
                    version: p.version,
                    name: p.name.to_owned(),
                })
                .collect(),
            other => {
                return Err(ServiceStartError::Control(ControlError::Protocol(format!(
                    "expected the plugin list, got {other:?}"
                ))));
            }
        };
        let reply = channel
            .call(ControlMessage::CpusetRequest)
            .map_err(ServiceStartError::Control)?;
        let ControlMessage::CpusetReply(cpuset) = reply.message() else {
            return Err(ServiceStartError::Control(ControlError::Protocol(
                "expected the CPU set".into(),
            )));
        };
        Ok(Shared {
            channel,
            max_msg_size: max,
            plugins,
            cpuset,
            max_workers: self.config.max_workers,
            workers: AtomicUsize::new(0),
        })
    }
}

impl Service<Running> {
    fn shared(&self) -> &Shared {
        &self.data.shared
    }

    pub(crate) fn shared_handle(&self) -> Arc<Shared> {
        Arc::clone(&self.data.shared)
    }

    /// The plugins the service offers.
    pub fn plugins(&self) -> &[ServicePlugin] {
        &self.shared().plugins
    }

    /// The plugin called `name`.
    pub fn plugin(&self, name: &str) -> Option<&ServicePlugin> {
        self.plugins().iter().find(|p| p.name == name)
    }

    /// The CPUs workers may use.
    pub fn cpuset(&self) -> CpuSet {
        self.shared().cpuset
    }

    /// The ids of the workers of group `gid`.
    pub fn workers_by_gid(&self, gid: u32) -> Result<Vec<u64>, ControlError> {
        let reply = self
            .shared()
            .channel
            .call(ControlMessage::WorkersByGidRequest { gid })?;
        match reply.message() {
            ControlMessage::WorkersByGidReply(ids) => Ok(ids.iter().collect()),
            other => Err(ControlError::Protocol(format!(
                "expected worker ids, got {other:?}"
            ))),
        }
    }

    /// Queries the workers of group `gid` as a task: `callback` runs from `engine.progress()`
    /// once the answer is there.
    pub fn workers_by_gid_task(
        &self,
        engine: &mut ProgressEngine,
        gid: u32,
        callback: GidCallback,
    ) -> Result<(), ControlError> {
        self.workers_by_gid_task_with(engine, gid, callback)
    }

    /// [`Service::workers_by_gid_task`] with a closure, which may carry the caller's context
    /// (the task it completes, say); it runs once, from `engine.progress()`.
    pub fn workers_by_gid_task_with<F>(
        &self,
        engine: &mut ProgressEngine,
        gid: u32,
        callback: F,
    ) -> Result<(), ControlError>
    where
        F: FnOnce(u32, Result<&[u64], &ControlError>) + 'static,
    {
        let reply = self
            .shared()
            .channel
            .request(ControlMessage::WorkersByGidRequest { gid })?;
        engine.add_task(Box::new(GidTask {
            gid,
            reply,
            callback: Some(callback),
        }));
        Ok(())
    }

    /// Disconnects; the daemon tears down the workers only this host used.
    pub fn stop(self) -> Service<Idle> {
        self.data.shared.channel.close();
        Service {
            config: self.config,
            data: (),
        }
    }
}

/// A workers-by-gid query in flight; its callback runs once (`None` afterwards).
struct GidTask<F> {
    gid: u32,
    reply: std::sync::mpsc::Receiver<super::control::Reply>,
    callback: Option<F>,
}

impl<F> OneShot for GidTask<F>
where
    F: FnOnce(u32, Result<&[u64], &ControlError>) + 'static,
{
    fn poll(&mut self) -> bool {
        let reply = match self.reply.try_recv() {
            Ok(reply) => Some(reply),
            Err(std::sync::mpsc::TryRecvError::Empty) => return false,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => None,
        };
        let Some(callback) = self.callback.take() else {
            return true;
        };
        let Some(reply) = reply else {
            callback(self.gid, Err(&ControlError::Closed));
            return true;
        };
        match (reply.refusal(), reply.message()) {
            (Err(error), _) => callback(self.gid, Err(&error)),
            (Ok(()), ControlMessage::WorkersByGidReply(ids)) => {
                let ids: Vec<u64> = ids.iter().collect();
                callback(self.gid, Ok(&ids));
            }
            (Ok(()), other) => {
                let error = ControlError::Protocol(format!("expected worker ids, got {other:?}"));
                callback(self.gid, Err(&error));
            }
        }
        true
    }
}

#[cfg(test)]
mod remote_tests {
    use super::*;

    #[test]
    fn a_remote_address_gets_the_default_port_unless_it_names_one() {
        assert_eq!(with_default_port("dpu-1"), "dpu-1:13340");
        assert_eq!(with_default_port("dpu-1:7000"), "dpu-1:7000");
        assert_eq!(with_default_port("169.254.77.1"), "169.254.77.1:13340");
        assert_eq!(with_default_port("fe80::1"), "[fe80::1]:13340");
        assert_eq!(with_default_port("[fe80::1]:7000"), "[fe80::1]:7000");
    }

    #[test]
    fn a_service_file_line_for_another_machine_is_remote() {
        let dir = std::env::temp_dir().join(format!("urom-service-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("services");
        let hostname = nix::unistd::gethostname().unwrap().into_string().unwrap();
        std::fs::write(
            &file,
            format!("{hostname} dpu 169.254.77.1 0000:03:00.0 eth1,eth2\n"),
        )
        .unwrap();
        let service = Service::new().set_service_file(&file);
        match service.locate() {
            Ok(ServiceAt::Remote {
                address,
                net_devices,
            }) => {
                assert_eq!(address, "169.254.77.1:13340");
                assert_eq!(net_devices, ["eth1", "eth2"]);
            }
            _ => panic!("the line names another machine"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
