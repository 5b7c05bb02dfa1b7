//! The channel across machines (feature `ucx`): the control connection and the data
//! connections are urom UCX connections.
//!
//! The server listens on the `-c ucx://IP:PORT` address with the control connection's fixed
//! settings ([`control_config`]), so that any two builds can exchange hellos whatever their
//! flags; once they agree, it listens for the data connections on another port of the same
//! address, with frames of the agreed size, and names that port on the control connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use urom_core::transport::ucx::{UcxConnectError, UcxConnection, UcxListener};
use urom_core::transport::{ChannelConfig, ConnectError};
use urom_wire::MaxMsgSize;
use urom_wire::gpu::channel::{DataHelloRepr, DataListenerRepr};

use super::connections::{DataConnections, OrchestratorChannel, ServerChannel};
use super::control::Control;
use super::error::ChannelError;
use super::params::{ChannelParams, STEP_TIMEOUT, TICK};
use super::setup::{
    SetupLink, check_data_hello, exchange_as_orchestrator, exchange_as_server, orchestrator_hellos,
    recv_one, send_frame, server_hellos,
};

/// How long the orchestrator waits between attempts to reach a server that is not there yet.
const RETRY: Duration = Duration::from_millis(250);

/// The settings of every UCX control connection: small frames, a few slots. Never derived
/// from flags: a mismatch here would fail in UCX's handshake, before the hellos could say what
/// differs.
pub fn control_config() -> ChannelConfig {
    ChannelConfig {
        max_msg_size: MaxMsgSize::DEFAULT,
        slots: 8,
        handshake_timeout: STEP_TIMEOUT,
        ..ChannelConfig::default()
    }
}

impl SetupLink for UcxConnection {
    fn put(&mut self, record: &[u8]) -> Result<(), ChannelError> {
        send_frame(self, record, "during the channel setup")
    }

    fn get<R>(
        &mut self,
        _len: usize,
        when: &'static str,
        read: impl FnOnce(&[u8]) -> Result<R, ChannelError>,
    ) -> Result<R, ChannelError> {
        recv_one(self, when, read)
    }
}

/// The server's UCX listener for the orchestrator's control connection.
pub(super) struct Listener {
    control: UcxListener,
    address: SocketAddr,
}

impl Listener {
    /// Listens on `address` (port 0: any free port).
    pub(super) fn bind(address: SocketAddr) -> Result<Self, ChannelError> {
        let control =
            UcxListener::bind(address, &control_config()).map_err(|e| ChannelError::ListenUcx {
                address,
                source: e.into(),
            })?;
        Ok(Self { control, address })
    }

    /// Where it listens, with the real port.
    pub(super) fn local_addr(&self) -> SocketAddr {
        self.control.local_addr()
    }

    /// Waits for the orchestrator (until `stop`), agrees on `ours`, listens for the data
    /// connections and sets them up.
    pub(super) fn accept(
        &mut self,
        ours: &ChannelParams,
        stop: &AtomicBool,
    ) -> Result<ServerChannel, ChannelError> {
        let mut control = accept_until(
            &mut self.control,
            stop,
            None,
            "waiting for the orchestrator",
        )?;
        let params = server_hellos(&mut control, ours)?;
        let config = params.channel_config()?;
        let at = SocketAddr::new(self.address.ip(), 0);
        let mut listener = UcxListener::bind(at, &config).map_err(|e| ChannelError::ListenUcx {
            address: at,
            source: e.into(),
        })?;
        let port = listener.local_addr().port();
        tracing::debug!(port, "listening for the data connections");
        control.put(&DataListenerRepr { port }.to_bytes())?;
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut data = Vec::with_capacity(params.threads as usize);
        for index in 0..params.threads {
            let mut conn = accept_until(&mut listener, stop, Some(deadline), "data connections")?;
            recv_one(
                &mut conn,
                "before announcing a data connection",
                |announce| check_data_hello(announce, index),
            )?;
            exchange_as_server(&mut conn, index, params.max_message_length)?;
            data.push(conn);
        }
        Ok(ServerChannel {
            control: Control::ucx(control),
            data: DataConnections::Ucx(data),
            params,
        })
    }
}

/// The next connection on `listener`, waiting until `stop` is set or `deadline` passes.
fn accept_until(
    listener: &mut UcxListener,
    stop: &AtomicBool,
    deadline: Option<Instant>,
    what: &'static str,
) -> Result<UcxConnection, ChannelError> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(ChannelError::Stopped);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(ChannelError::Timeout(what));
        }
        match listener.accept(TICK) {
            Ok(Some(conn)) => return Ok(conn),
            Ok(None) => {}
            Err(e) => return Err(ChannelError::AcceptUcx(e.into())),
        }
    }
}

/// Connects to the server's UCX listener at `address`, retrying until it listens, `stop` is
/// set or `wait` passes; agrees on `ours` and sets up the data connections.
pub(super) fn connect(
    address: SocketAddr,
    ours: &ChannelParams,
    wait: Duration,
    stop: &AtomicBool,
) -> Result<OrchestratorChannel, ChannelError> {
    let deadline = Instant::now() + wait;
    let mut control = loop {
        match UcxConnection::connect(address, &control_config()) {
            Ok(conn) => break conn,
            Err(e @ UcxConnectError::Unreachable { .. }) => {
                if stop.load(Ordering::Relaxed) {
                    return Err(ChannelError::Stopped);
                }
                if Instant::now() >= deadline {
                    return Err(ChannelError::ConnectUcx {
                        address,
                        source: e.into(),
                    });
                }
                std::thread::sleep(RETRY);
            }
            Err(e) => {
                return Err(ChannelError::ConnectUcx {
                    address,
                    source: e.into(),
                });
            }
        }
    };
    let params = orchestrator_hellos(&mut control, ours)?;
    let config = params.channel_config()?;
    let port = recv_one(&mut control, "before naming its data listener", |record| {
        DataListenerRepr::parse(record).map_err(|_| ChannelError::NotAPeer)
    })?
    .port;
    let data_address = SocketAddr::new(address.ip(), port);
    let mut data = Vec::with_capacity(params.threads as usize);
    for index in 0..params.threads {
        let mut conn = UcxConnection::connect(data_address, &config)
            .map_err(|e| ChannelError::DataSetup(ConnectError::from(e)))?;
        send_frame(
            &mut conn,
            &DataHelloRepr { thread: index }.to_bytes(),
            "announcing a data connection",
        )?;
        exchange_as_orchestrator(&mut conn, index, params.max_message_length)?;
        data.push(conn);
    }
    Ok(OrchestratorChannel {
        control: Control::ucx(control),
        data: DataConnections::Ucx(data),
        params,
    })
}
