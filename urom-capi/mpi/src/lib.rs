//! `liburom_mpi`: an MPI program's collectives offloaded to urom, with no change to its source.
//!
//! Loaded before libmpi (`LD_PRELOAD=liburom_mpi.so mpirun ...`), the library's `MPI_*`
//! functions run instead of the MPI library's (the MPI profiling interface), hand what urom can
//! do to the node's urom worker through `liburom_coll` (`urom_coll.h`, package
//! `urom-capi-coll`), and pass everything else to `PMPI_*` untouched. The interposition is C
//! (`src/urom_mpi.c`, compiled with Open MPI's `mpicc` flags by the build script); this crate
//! builds it into `liburom_mpi.so`, which records `liburom_coll.so` as a library it needs
//! (RUNPATH `$ORIGIN`: keep the two in one directory) and `libmpi.so`.
//!
//! Without `mpicc` the build script says so in a warning and the library holds no MPI
//! functions; its tests then skip with that reason.
//!
//! See `docs/mpi.md` for what is offloaded, the fallbacks and the request semantics.
#![forbid(unsafe_code)]
