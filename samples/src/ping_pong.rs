//! The ping-pong sample of the DOCA UROM guide: ranks (processes), each with its own worker
//! running the sandbox plugin, join a domain and pass a message worker to worker.
//!
//! Per rank: a service (at most 32 workers), the `worker_sandbox` plugin (version 1), a worker
//! with id = rank, 16 tasks in flight and the sandbox plugin, a domain over the out-of-band
//! collective with the worker as domain id = rank and no buffers; then the ping-pong; then the
//! domain, the worker and the service are torn down, after a last barrier.
//!
//! The ping-pong, every message sent to `(rank + 1) % ranks`, inline, tag mask `0xffff`:
//!
//! * rank 0 (the server) receives `PING` (context `0xdead`), prints
//!   `Server completed PING recv: <message>`, and sends `PONG`;
//! * every other rank (a client) first posts its receive of `PONG` (context `0xbeef`); rank 1
//!   sends `PING`, a later rank receives the `PING` from the rank before it and passes it on;
//!   on its `PONG` a client prints `Client received PONG recv: <message>` and, unless it is the
//!   last rank, passes it on.
//!
//! With two ranks this is the DOCA sample exactly (rank 1 pings rank 0, which pongs back); with
//! more, `PING` goes round the ring `1 -> 2 -> ... -> 0` and `PONG` comes back `0 -> 1 -> ...`.
//! Each check (the context, the sender's tag, UCX's status, the message) fails the rank with a
//! message naming what was wrong.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use urom_host::oob::{OobCollective, OobError, OobRequest};
use urom_host::{
    CompletedTask, Domain, DomainStartProgress, Idle, ProgressEngine, Running, Service, Worker,
};
use urom_sandbox::{
    self as sandbox, Received, RecvInto, SandboxHost, SendFrom, tag_recv_result, tag_send_result,
};

/// The tag of the client's message.
pub const PING_TAG: u64 = 0x1234;
/// The tag of the server's answer.
pub const PONG_TAG: u64 = 0x5678;
/// The tag bits that must match.
pub const TAG_MASK: u64 = 0xffff;
/// The context of the server's receive.
pub const SERVER_RECV_CONTEXT: u64 = 0xdead;
/// The context of a client's receive.
pub const CLIENT_RECV_CONTEXT: u64 = 0xbeef;
/// The context of sends.
const SEND_CONTEXT: u64 = 0x5e4d;
/// The receive count: the longest message (99 characters) and its NUL.
pub const RECV_COUNT: u64 = 100;
/// The longest message, in characters.
pub const MAX_MESSAGE_CHARS: usize = 99;
/// The message when none is given.
pub const DEFAULT_MESSAGE: &str = "hello world";

/// What one rank does.
#[derive(Debug, Clone)]
pub struct RankConfig {
    /// The message (at most 99 characters).
    pub message: String,
    /// The network device the worker's UCX uses (`UCX_NET_DEVICES`); any when `None`.
    pub device: Option<String>,
    /// The daemon's socket; from `DOCA_UROM_SERVICE_FILE`, else the default, when `None`.
    pub socket: Option<std::path::PathBuf>,
    /// How long any one step may take.
    pub timeout: Duration,
}

/// Checks a message given on the command line.
pub fn check_message(message: &str) -> Result<()> {
    let chars = message.chars().count();
    if chars > MAX_MESSAGE_CHARS {
        bail!("the message has {chars} characters; at most {MAX_MESSAGE_CHARS} fit");
    }
    if message.contains('\0') {
        bail!("the message may not contain a NUL character");
    }
    Ok(())
}

/// An out-of-band collective shared between the domain and the rank's last barrier.
#[derive(Clone)]
pub struct SharedOob(Rc<RefCell<Box<dyn OobCollective>>>);

impl SharedOob {
    /// Shares `oob`.
    pub fn new(oob: impl OobCollective + 'static) -> Self {
        Self(Rc::new(RefCell::new(Box::new(oob))))
    }

    /// Waits until every rank got here (an allgather of one byte), at most `timeout`.
    pub fn barrier(&self, timeout: Duration) -> Result<()> {
        let mut oob = self.0.borrow_mut();
        let mut request = oob.allgather(&[1]).map_err(|e| anyhow!("{e}"))?;
        let deadline = Instant::now() + timeout;
        loop {
            if oob.test(&mut request).map_err(|e| anyhow!("{e}"))? {
                oob.free(request);
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("the other ranks did not reach the last barrier within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl OobCollective for SharedOob {
    fn size(&self) -> u32 {
        self.0.borrow().size()
    }

    fn rank(&self) -> u32 {
        self.0.borrow().rank()
    }

    fn allgather(&mut self, send: &[u8]) -> Result<OobRequest, OobError> {
        self.0.borrow_mut().allgather(send)
    }

    fn test(&mut self, request: &mut OobRequest) -> Result<bool, OobError> {
        self.0.borrow_mut().test(request)
    }

    fn free(&mut self, request: OobRequest) {
        self.0.borrow_mut().free(request)
    }
}

/// A finished sandbox task, as the callbacks record it.
#[derive(Debug)]
enum Done {
    Sent {
        cookie: u64,
        result: Result<(u64, i32), String>,
    },
    Received {
        cookie: u64,
        result: Result<(u64, u64, i32, Vec<u8>), String>,
    },
}

std::thread_local! {
    static DONE: RefCell<Vec<Done>> = const { RefCell::new(Vec::new()) };
}

fn on_send(task: &CompletedTask<'_>) {
    let cookie = u64::from_le_bytes(task.user_data[..8].try_into().expect("8 bytes"));
    let result = tag_send_result(task)
        .map(|r| (r.context, r.ucs_status))
        .map_err(|status| status.to_string());
    DONE.with(|done| done.borrow_mut().push(Done::Sent { cookie, result }));
}

fn on_recv(task: &CompletedTask<'_>) {
    let cookie = u64::from_le_bytes(task.user_data[..8].try_into().expect("8 bytes"));
    let result = tag_recv_result(task)
        .map_err(|status| status.to_string())
        .and_then(|r| match r.data {
            Received::Inline(bytes) => Ok((r.context, r.sender_tag, r.ucs_status, bytes.to_vec())),
            Received::Memory { len } => Err(format!(
                "{len} bytes went to host memory; an inline receive was asked for"
            )),
        });
    DONE.with(|done| done.borrow_mut().push(Done::Received { cookie, result }));
}

/// The rank's side of the exchange: its engine, worker and plugin.
struct Rank<'a> {
    engine: &'a mut ProgressEngine,
    worker: &'a Worker<Running>,
    sandbox: SandboxHost,
    dest: u64,
    timeout: Duration,
    next_cookie: u64,
}

impl Rank<'_> {
    fn send(&mut self, tag: u64, bytes: &[u8]) -> Result<u64> {
        self.next_cookie += 1;
        let cookie = self.next_cookie;
        self.sandbox
            .tag_send(
                self.worker,
                cookie,
                SEND_CONTEXT,
                self.dest,
                SendFrom::Inline(bytes),
                tag,
                on_send,
            )
            .map_err(|e| anyhow!("the tag send could not be submitted: {e}"))?;
        Ok(cookie)
    }

    fn recv(&mut self, tag: u64, context: u64) -> Result<u64> {
        self.next_cookie += 1;
        let cookie = self.next_cookie;
        self.sandbox
            .tag_recv(
                self.worker,
                cookie,
                context,
                RecvInto::Inline {
                    capacity: RECV_COUNT,
                },
                tag,
                TAG_MASK,
                on_recv,
            )
            .map_err(|e| anyhow!("the tag receive could not be submitted: {e}"))?;
        Ok(cookie)
    }

    /// Progresses until the task `cookie` finished; takes its record.
    fn wait(&mut self, cookie: u64, what: &str) -> Result<Done> {
        let deadline = Instant::now() + self.timeout;
        loop {
            self.engine.progress();
            let found = DONE.with(|done| {
                let mut done = done.borrow_mut();
                let at = done.iter().position(|d| match d {
                    Done::Sent { cookie: c, .. } | Done::Received { cookie: c, .. } => *c == cookie,
                })?;
                Some(done.swap_remove(at))
            });
            if let Some(found) = found {
                return Ok(found);
            }
            if Instant::now() >= deadline {
                bail!("{what} did not complete within {:?}", self.timeout);
            }
        }
    }

    fn wait_sent(&mut self, cookie: u64, what: &str) -> Result<()> {
        match self.wait(cookie, what)? {
            Done::Sent {
                result: Ok((context, 0)),
                ..
            } if context == SEND_CONTEXT => Ok(()),
            Done::Sent {
                result: Ok((context, status)),
                ..
            } => bail!("{what} ended with context {context:#x} and UCX status {status}"),
            Done::Sent {
                result: Err(why), ..
            } => bail!("{what} failed: {why}"),
            Done::Received { .. } => bail!("{what}: a receive answered a send"),
        }
    }

    /// Waits for receive `cookie` and checks it; the message (without its NUL).
    fn wait_received(&mut self, cookie: u64, tag: u64, context: u64, what: &str) -> Result<String> {
        let (got_context, sender_tag, status, bytes) = match self.wait(cookie, what)? {
            Done::Received { result: Ok(r), .. } => r,
            Done::Received {
                result: Err(why), ..
            } => bail!("{what} failed: {why}"),
            Done::Sent { .. } => bail!("{what}: a send answered a receive"),
        };
        if got_context != context {
            bail!("{what} carried context {got_context:#x}, not {context:#x}");
        }
        if sender_tag & TAG_MASK != tag & TAG_MASK {
            bail!("{what} matched sender tag {sender_tag:#x}, not {tag:#x}");
        }
        if status != 0 {
            bail!("{what} ended with UCX status {status}");
        }
        let text = bytes.split(|&b| b == 0).next().unwrap_or_default();
        Ok(String::from_utf8_lossy(text).into_owned())
    }
}

/// Runs one rank over `oob` (its size and rank), printing the sample's lines through `out`.
pub fn run_rank(config: &RankConfig, oob: SharedOob, out: &dyn Fn(&str)) -> Result<()> {
    check_message(&config.message)?;
    let (size, rank) = (oob.size(), oob.rank());
    let mut service = Service::<Idle>::new().set_identity(format!("urom-ping-pong-{rank}"));
    service = service
        .set_max_workers(32)
        .map_err(|_| anyhow!("32 workers are not allowed"))?;
    if let Some(socket) = &config.socket {
        service = service.set_socket(socket);
    }
    let service = service
        .start()
        .map_err(|(_, e)| anyhow!("rank {rank}: the UROM service did not start: {e}"))?;
    let result = with_service(config, &service, oob, size, rank, out);
    service.stop();
    result
}

fn with_service(
    config: &RankConfig,
    service: &Service<Running>,
    oob: SharedOob,
    size: u32,
    rank: u32,
    out: &dyn Fn(&str),
) -> Result<()> {
    let plugin = service.plugin(sandbox::NAME).ok_or_else(|| {
        anyhow!(
            "rank {rank}: the service offers no {} plugin (put worker_sandbox.so in \
             UROM_PLUGIN_PATH)",
            sandbox::NAME
        )
    })?;
    let sandbox =
        SandboxHost::init(plugin.id, plugin.version).map_err(|e| anyhow!("rank {rank}: {e}"))?;
    let mut engine = ProgressEngine::new();
    let mut worker = Worker::new()
        .set_service(service)
        .set_id(u64::from(rank))
        .set_plugins(sandbox.id())
        .set_max_inflight_tasks(16);
    if let Some(device) = &config.device {
        worker = worker.set_env([format!("UCX_NET_DEVICES={device}")]);
    }
    let worker = crate::run_worker(&mut engine, worker)
        .with_context(|| format!("rank {rank}: the worker"))?;
    let result = with_worker(config, &mut engine, &worker, sandbox, oob, size, rank, out);
    if let Err((_, e)) = worker.stop() {
        if result.is_ok() {
            bail!("rank {rank}: the worker did not stop: {e}");
        }
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn with_worker(
    config: &RankConfig,
    engine: &mut ProgressEngine,
    worker: &Worker<Running>,
    sandbox: SandboxHost,
    oob: SharedOob,
    size: u32,
    rank: u32,
    out: &dyn Fn(&str),
) -> Result<()> {
    let domain = Domain::new()
        .set_oob(oob.clone())
        .set_workers(&[u64::from(rank)], &[worker])
        .map_err(|(_, e)| anyhow!("rank {rank}: {e}"))?
        .start(engine)
        .map_err(|(_, e)| anyhow!("rank {rank}: the domain did not start: {e}"))?;
    let domain = match domain.wait_running(engine, config.timeout) {
        Ok(domain) => domain,
        Err(DomainStartProgress::Failed(_, e)) => bail!("rank {rank}: the domain failed: {e}"),
        Err(DomainStartProgress::Starting(_)) => bail!(
            "rank {rank}: the domain did not start within {:?}",
            config.timeout
        ),
    };
    let mut me = Rank {
        engine,
        worker,
        sandbox,
        dest: u64::from((rank + 1) % size),
        timeout: config.timeout,
        next_cookie: 0,
    };
    let result = ping_pong(&mut me, config, size, rank, out);
    drop(domain.stop());
    // Nobody leaves before everyone is done: a worker that went away could fail a peer's
    // last receive.
    let barrier = oob
        .barrier(config.timeout)
        .with_context(|| format!("rank {rank}"));
    result.and(barrier)
}

fn ping_pong(
    me: &mut Rank<'_>,
    config: &RankConfig,
    size: u32,
    rank: u32,
    out: &dyn Fn(&str),
) -> Result<()> {
    let mut message = config.message.clone().into_bytes();
    message.push(0);
    if rank == 0 {
        let recv = me.recv(PING_TAG, SERVER_RECV_CONTEXT)?;
        let got = me.wait_received(recv, PING_TAG, SERVER_RECV_CONTEXT, "the PING receive")?;
        out(&format!("Server completed PING recv: {got}"));
        let send = me.send(PONG_TAG, &message)?;
        return me.wait_sent(send, "the PONG send");
    }
    let pong = me.recv(PONG_TAG, CLIENT_RECV_CONTEXT)?;
    if rank == 1 {
        let send = me.send(PING_TAG, &message)?;
        me.wait_sent(send, "the PING send")?;
    } else {
        // PING comes round the ring from the rank before; pass it on.
        let recv = me.recv(PING_TAG, SERVER_RECV_CONTEXT)?;
        let got = me.wait_received(recv, PING_TAG, SERVER_RECV_CONTEXT, "the PING receive")?;
        check_same(&got, config, "PING")?;
        let send = me.send(PING_TAG, &message)?;
        me.wait_sent(send, "the PING send")?;
    }
    let got = me.wait_received(pong, PONG_TAG, CLIENT_RECV_CONTEXT, "the PONG receive")?;
    check_same(&got, config, "PONG")?;
    out(&format!("Client received PONG recv: {got}"));
    if rank + 1 < size {
        let send = me.send(PONG_TAG, &message)?;
        me.wait_sent(send, "the PONG send")?;
    }
    Ok(())
}

fn check_same(got: &str, config: &RankConfig, what: &str) -> Result<()> {
    if got != config.message {
        bail!(
            "{what} carried `{got}`, not the message `{}`",
            config.message
        );
    }
    Ok(())
}

/// How the ranks of a launch exchange their records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OobKind {
    /// A socket rendezvous (`urom_host::oob::SocketOob`): rank 0 listens.
    Socket,
    /// MPI (`MPI_Iallgather` on `MPI_COMM_WORLD`), for ranks started by `mpirun`.
    Mpi,
}

/// Starts `ranks` processes of this program, each running one rank (`--rank I`) over a socket
/// rendezvous in a fresh directory, with the same message, device, socket and timeout; their
/// lines go to this process's standard output. Waits for all of them; the first failure
/// (others are then stopped) or `Ok`.
pub fn launch(ranks: u32, config: &RankConfig) -> Result<()> {
    if ranks < 2 {
        bail!("a ping-pong needs at least 2 ranks, not {ranks}");
    }
    check_message(&config.message)?;
    let program = std::env::current_exe().context("this program's path")?;
    let dir = std::env::temp_dir().join(format!("urom-ping-pong-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating the rendezvous directory {}", dir.display()))?;
    let rendezvous = format!("unix:{}", dir.join("rendezvous.sock").display());
    let mut children = Vec::new();
    let mut spawned = Ok(());
    for rank in 0..ranks {
        let mut command = std::process::Command::new(&program);
        command
            .args(["--oob", "socket", "--rendezvous", &rendezvous])
            .args(["--ranks", &ranks.to_string(), "--rank", &rank.to_string()])
            .args(["--message", &config.message])
            .args(["--timeout", &config.timeout.as_secs().max(1).to_string()]);
        if let Some(device) = &config.device {
            command.args(["--device", device]);
        }
        if let Some(socket) = &config.socket {
            command.arg("--socket").arg(socket);
        }
        match command.spawn() {
            Ok(child) => children.push((rank, child)),
            Err(e) => {
                spawned = Err(anyhow!("starting rank {rank} ({}): {e}", program.display()));
                break;
            }
        }
    }
    let waited = wait_all(&mut children, spawned.is_err(), config.timeout * 4);
    let _ = std::fs::remove_dir_all(&dir);
    spawned.and(waited)
}

/// Waits for every child, at most `timeout`; once one fails (or `stop` from the start), the
/// others are killed. The first failure.
fn wait_all(
    children: &mut [(u32, std::process::Child)],
    stop: bool,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut failure: Option<anyhow::Error> = None;
    let mut stop = stop;
    let mut left: Vec<usize> = (0..children.len()).collect();
    while !left.is_empty() {
        if stop || Instant::now() >= deadline {
            if failure.is_none() {
                failure = Some(anyhow!("the ranks did not finish within {timeout:?}"));
            }
            for &i in &left {
                let _ = children[i].1.kill();
            }
            stop = true;
        }
        let mut i = 0;
        while i < left.len() {
            let (rank, child) = &mut children[left[i]];
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() && failure.is_none() {
                        failure = Some(anyhow!("rank {rank} failed ({status})"));
                        stop = true;
                    }
                    left.swap_remove(i);
                }
                Ok(None) => i += 1,
                Err(e) => {
                    failure.get_or_insert(anyhow!("waiting for rank {rank}: {e}"));
                    left.swap_remove(i);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    failure.map_or(Ok(()), Err)
}
