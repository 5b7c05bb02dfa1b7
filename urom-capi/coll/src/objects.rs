//! What the C handles point to. Safe Rust: the exported functions (`ffi`) check handles and
//! threads, then call these.
//!
//! A context's [`Shared`] part (service, progress engine, the node's worker) is reference
//! counted by every team, buffer and collective made from it, so destroying handles in any
//! order frees nothing still in use; urom-coll's own counting keeps a buffer registered while
//! a collective over it exists.

use std::cell::{Cell, RefCell, RefMut};
use std::path::PathBuf;
use std::rc::Rc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use urom_coll::{
    Buffer, CollError, CollHost, CollKind, CollSpec, Collective, Datatype, ReduceOp, SETUP_TIMEOUT,
    Team, node_worker,
};
use urom_host::oob::OobCollective;
use urom_host::{CommandError, Idle, ProgressEngine, Running, Service, Worker};

use crate::status::{Failure, UromStatus};

/// The environment variable naming the service's socket (as for `libdoca_urom`).
pub const SOCKET_VAR: &str = "UROM_SERVICE_SOCKET";

/// A magic word per kind of object: a handle whose memory does not hold it is refused.
pub mod magic {
    /// A context.
    pub const CONTEXT: u64 = 0x7572_6f6d_6374_7831;
    /// A team.
    pub const TEAM: u64 = 0x7572_6f6d_7465_616d;
    /// A buffer.
    pub const BUFFER: u64 = 0x7572_6f6d_6275_6666;
    /// A collective.
    pub const REQ: u64 = 0x7572_6f6d_636f_6c6c;
}

/// What a context and everything made from it share.
pub struct Shared {
    engine: RefCell<ProgressEngine>,
    host: CollHost,
    worker: Rc<Worker<Running>>,
    _service: Service<Running>,
    thread: ThreadId,
}

impl Shared {
    /// Whether the calling thread is the context's.
    pub fn on_my_thread(&self) -> Result<(), Failure> {
        if std::thread::current().id() == self.thread {
            Ok(())
        } else {
            Err(Failure::new(
                UromStatus::WrongThread,
                "a urom_coll context is used only from the thread that created it",
            ))
        }
    }

    /// The progress engine; an error when a completion callback calls back into the library.
    pub fn engine(&self) -> Result<RefMut<'_, ProgressEngine>, Failure> {
        self.engine.try_borrow_mut().map_err(|_| {
            Failure::new(
                UromStatus::Busy,
                "called from a completion callback: callbacks must not call into urom_coll",
            )
        })
    }
}

/// Gathers `send` from every member of `oob` (one byte string each, the same length).
fn allgather(oob: &mut dyn OobCollective, send: &[u8]) -> Result<Vec<u8>, Failure> {
    let oob_failed = |e: urom_host::oob::OobError| Failure::new(UromStatus::Oob, e.to_string());
    let mut request = oob.allgather(send).map_err(oob_failed)?;
    let deadline = Instant::now() + SETUP_TIMEOUT;
    let done = loop {
        match oob.test(&mut request) {
            Ok(true) => break Ok(()),
            Ok(false) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(20));
            }
            Ok(false) => {
                break Err(Failure::new(
                    UromStatus::TimedOut,
                    "the out-of-band allgather did not complete in time",
                ));
            }
            Err(e) => break Err(oob_failed(e)),
        }
    };
    let received = request.received().to_vec();
    oob.free(request);
    done.map(|()| received)
}

/// A context: `urom_coll_context_h`.
pub struct ContextObj {
    /// [`magic::CONTEXT`] while alive.
    pub magic: Cell<u64>,
    /// The shared part.
    pub shared: Rc<Shared>,
}

impl ContextObj {
    /// Connects to the service, then starts (first member) or attaches to the node's worker.
    /// Collective over `oob`: when any member cannot reach the service, all fail.
    pub fn create(oob: &mut dyn OobCollective, socket: Option<PathBuf>) -> Result<Self, Failure> {
        let thread = std::thread::current().id();
        let mut service = Service::<Idle>::new();
        if let Some(socket) = socket.or_else(|| std::env::var_os(SOCKET_VAR).map(PathBuf::from)) {
            service = service.set_socket(socket);
        }
        let connected = service
            .start()
            .map_err(|(_, e)| format!("cannot reach the urom service: {e}"))
            .and_then(|service| match CollHost::new(&service) {
                Ok(host) => Ok((service, host)),
                Err(e) => Err(e.to_string()),
            });
        let all = allgather(oob, &[u8::from(connected.is_ok())])?;
        if let Some(rank) = all.iter().position(|&ok| ok == 0) {
            let why = match &connected {
                Err(e) => e.clone(),
                Ok(_) => format!("rank {rank} cannot reach the urom service"),
            };
            return Err(Failure::new(UromStatus::NoService, why));
        }
        let (service, host) = connected.map_err(|e| Failure::new(UromStatus::NoService, e))?;
        let mut engine = ProgressEngine::new();
        let worker = node_worker(&mut engine, &service, &host, oob)?;
        Ok(Self {
            magic: Cell::new(magic::CONTEXT),
            shared: Rc::new(Shared {
                engine: RefCell::new(engine),
                host,
                worker: Rc::new(worker),
                _service: service,
                thread,
            }),
        })
    }

    /// Progresses the engine once.
    pub fn progress(&self) -> Result<UromStatus, Failure> {
        self.shared.engine()?.progress();
        Ok(UromStatus::Ok)
    }
}

/// A team: `urom_coll_team_h`.
pub struct TeamObj {
    /// [`magic::TEAM`] while alive.
    pub magic: Cell<u64>,
    /// The context's shared part.
    pub shared: Rc<Shared>,
    /// The team.
    pub team: Team,
}

impl TeamObj {
    /// Forms a team of `oob`'s members on the context's worker.
    pub fn create(shared: &Rc<Shared>, oob: &mut dyn OobCollective) -> Result<Self, Failure> {
        let mut engine = shared.engine()?;
        let team = Team::create(&mut engine, &shared.worker, &shared.host, oob, None)?
            .ok_or_else(|| Failure::new(UromStatus::Internal, "every member is in the team"))?;
        Ok(Self {
            magic: Cell::new(magic::TEAM),
            shared: Rc::clone(shared),
            team,
        })
    }

    /// Allocates `len` bytes shared with the worker.
    pub fn alloc(&self, len: usize) -> Result<BufferObj, Failure> {
        let buffer = self.team.alloc(&mut *self.shared.engine()?, len)?;
        Ok(BufferObj::new(&self.shared, buffer))
    }
}

/// A registered buffer: `urom_coll_buffer_h`.
pub struct BufferObj {
    /// [`magic::BUFFER`] while alive.
    pub magic: Cell<u64>,
    /// The context's shared part.
    pub shared: Rc<Shared>,
    /// The buffer.
    pub buffer: Buffer,
}

impl BufferObj {
    /// Wraps a registered buffer.
    pub fn new(shared: &Rc<Shared>, buffer: Buffer) -> Self {
        Self {
            magic: Cell::new(magic::BUFFER),
            shared: Rc::clone(shared),
            buffer,
        }
    }
}

/// A part of a buffer, as C describes it (`urom_coll_buffer_info_t`).
#[derive(Clone, Copy)]
pub struct Part<'a> {
    /// The buffer, if any.
    pub buffer: Option<&'a BufferObj>,
    /// Offset in elements.
    pub offset: u64,
    /// Count in elements.
    pub count: u64,
}

/// A collective as C describes it (`urom_coll_args_t`), its handles already checked.
pub struct Args<'a> {
    /// `urom_coll_type_t`.
    pub kind: u32,
    /// `urom_datatype_t`.
    pub datatype: u32,
    /// `urom_op_t`.
    pub op: u32,
    /// The root.
    pub root: u32,
    /// `UROM_COLL_FLAG_*`.
    pub flags: u32,
    /// The send buffer.
    pub src: Part<'a>,
    /// The receive buffer.
    pub dst: Part<'a>,
    /// A v-variant's counts and displacements.
    pub counts: &'a [u64],
}

/// `UROM_COLL_FLAG_IN_PLACE`.
pub const FLAG_IN_PLACE: u32 = 1;

/// A persistent collective: `urom_coll_req_h`.
pub struct ReqObj {
    /// [`magic::REQ`] while alive.
    pub magic: Cell<u64>,
    /// The context's shared part.
    pub shared: Rc<Shared>,
    coll: RefCell<Collective>,
}

fn invalid(why: &str) -> Failure {
    Failure::new(UromStatus::InvalidParam, why)
}

/// The spec `args` describes, its buffers checked to be `shared`'s.
fn spec_of<'a>(shared: &Rc<Shared>, args: &Args<'a>) -> Result<CollSpec<'a>, Failure> {
    let kind = u16::try_from(args.kind)
        .map(CollKind::from_raw)
        .ok()
        .filter(|k| !matches!(k, CollKind::Unknown(_)))
        .ok_or_else(|| invalid("unknown collective type"))?;
    let datatype = u8::try_from(args.datatype)
        .map(Datatype::from_raw)
        .ok()
        .filter(|d| !matches!(d, Datatype::Unknown(_)))
        .ok_or_else(|| invalid("unknown datatype"))?;
    let op = u8::try_from(args.op)
        .map(ReduceOp::from_raw)
        .ok()
        .filter(|o| !matches!(o, ReduceOp::Unknown(_)))
        .ok_or_else(|| invalid("unknown reduction operation"))?;
    if args.flags & !FLAG_IN_PLACE != 0 {
        return Err(invalid("unknown flags"));
    }
    for part in [args.src, args.dst] {
        if let Some(buffer) = part.buffer {
            if !Rc::ptr_eq(&buffer.shared, shared) {
                return Err(invalid("a buffer of another context"));
            }
        }
    }
    let mut spec = CollSpec::new(kind, datatype, args.src.count);
    spec.op = op;
    spec.root = args.root;
    spec.recv_count = args.dst.count;
    spec.in_place = args.flags & FLAG_IN_PLACE != 0;
    spec.send = args.src.buffer.map(|b| b.buffer.at(args.src.offset));
    spec.recv = args.dst.buffer.map(|b| b.buffer.at(args.dst.offset));
    spec.counts = args.counts.to_vec();
    Ok(spec)
}

impl ReqObj {
    /// Sets up the collective `args` describes on `team`.
    pub fn init(team: &TeamObj, args: &Args<'_>) -> Result<Self, Failure> {
        let spec = spec_of(&team.shared, args)?;
        let coll = team.team.init(&mut *team.shared.engine()?, &spec)?;
        Ok(Self {
            magic: Cell::new(magic::REQ),
            shared: Rc::clone(&team.shared),
            coll: RefCell::new(coll),
        })
    }

    /// Replaces this rank's part with `args` (this rank alone; see `urom_coll_rebind()`).
    pub fn rebind(&self, args: &Args<'_>) -> Result<(), Failure> {
        let spec = spec_of(&self.shared, args)?;
        let mut coll = self.coll()?;
        if coll.is_running() {
            return Err(Failure::new(
                UromStatus::Busy,
                "the collective is running: wait for it before rebinding it",
            ));
        }
        coll.rebind(&mut *self.shared.engine()?, &spec)?;
        Ok(())
    }

    fn coll(&self) -> Result<RefMut<'_, Collective>, Failure> {
        self.coll.try_borrow_mut().map_err(|_| {
            Failure::new(
                UromStatus::Busy,
                "called from this collective's completion callback",
            )
        })
    }

    /// Starts it. When every task slot is in flight (other collectives running), progresses
    /// until one frees.
    pub fn start(&self) -> Result<UromStatus, Failure> {
        let mut coll = self.coll()?;
        let deadline = Instant::now() + SETUP_TIMEOUT;
        loop {
            match coll.start() {
                Err(CollError::Submit(CommandError::Exhausted)) if Instant::now() < deadline => {
                    self.shared.engine()?.progress();
                }
                other => {
                    other?;
                    return Ok(UromStatus::Ok);
                }
            }
        }
    }

    /// Progresses once; its state.
    pub fn test(&self) -> Result<UromStatus, Failure> {
        let mut coll = self.coll()?;
        let outcome = coll.test(&mut *self.shared.engine()?);
        match outcome {
            None if coll.is_running() => Ok(UromStatus::InProgress),
            None | Some(Ok(())) => Ok(UromStatus::Ok),
            Some(Err(e)) => Err(e.into()),
        }
    }

    /// Progresses until it completed; its outcome.
    pub fn wait(&self) -> Result<UromStatus, Failure> {
        let mut coll = self.coll()?;
        match coll.wait(&mut *self.shared.engine()?) {
            None | Some(Ok(())) => Ok(UromStatus::Ok),
            Some(Err(e)) => Err(e.into()),
        }
    }

    /// Sets (or, with `None`, clears) the completion callback.
    pub fn set_callback(
        &self,
        callback: Option<Box<dyn FnMut(UromStatus)>>,
    ) -> Result<(), Failure> {
        let mut coll = self.coll()?;
        match callback {
            Some(mut callback) => coll.set_callback(move |outcome| {
                callback(match outcome {
                    Ok(()) => UromStatus::Ok,
                    Err(e) => crate::status::coll_status(&e),
                })
            }),
            None => coll.set_callback(|_| {}),
        }
        Ok(())
    }

    /// Whether it may be freed (it does not run).
    pub fn freeable(&self) -> Result<(), Failure> {
        if self.coll()?.is_running() {
            return Err(Failure::new(
                UromStatus::Busy,
                "the collective is running: wait for it before freeing it",
            ));
        }
        Ok(())
    }
}
