#pragma once
// Whether, and how, a job survives a lost rank: the fault-tolerant MPI
// interface (ULFM: MPIX_Comm_revoke, MPIX_Comm_shrink, MPIX_Comm_get_failed)
// behind functions that also build against an MPI without it.
//
// A job is fault tolerant when moerl was built against an MPI with ULFM
// (MOERL_HAVE_ULFM: the Open MPI 5 that scripts/setup.sh installs) and the
// job was launched with it on (`mpirun --with-ft ulfm` sets
// OMPI_MCA_mpi_ft_enable; scripts/launch.sh does so), unless
// MOERL_FAULT_TOLERANCE=off. Then MPI reports a dead peer as an error code
// instead of ending the job, and moerl fails over; otherwise a lost rank
// ends in a clean named stop and scripts/launch.sh restarts the job.
//
// One trap, measured with Open MPI 5.0: survivors that revoke MPI_COMM_WORLD
// itself never return from MPI_Finalize. Revoke and shrink duplicates only.

#include <mpi.h>

#include <string>
#include <vector>

namespace moerl::runtime {

// Built with ULFM, and this job launched with it on.
bool fault_tolerant_mpi();
// "Open MPI v5.0.11, fault tolerant (ULFM)" / "..., without ULFM (...)": the first log lines say it.
std::string mpi_description();

// True for the error codes that mean a peer died or the communicator was
// revoked (MPIX_ERR_PROC_FAILED, MPIX_ERR_PROC_FAILED_PENDING, MPIX_ERR_REVOKED).
bool is_process_failure(int mpi_error_code);

// Ranks of `comm` that MPI knows to have failed (empty without ULFM).
std::vector<int> failed_ranks(MPI_Comm comm);
// Waits (driving MPI's progress) until MPI knows every rank in `ranks` of
// `comm` to have failed; false when the deadline came first. Needed before
// MPI_Finalize after fencing a frozen rank: measured with Open MPI 5.0.11,
// survivors that finalize right after SIGKILLing a peer, before the runtime
// noticed its death, never return. True at once without ULFM.
bool wait_until_known_failed(MPI_Comm comm, const std::vector<int>& ranks, double timeout_s);
// Acknowledges the failures MPI reported on `comm`, so that receives from
// MPI_ANY_SOURCE work again (ULFM blocks them until then).
void acknowledge_failures(MPI_Comm comm);
// Interrupts every pending and future operation on `comm` at every member
// (they see MPIX_ERR_REVOKED): how one rank tells the others to recover.
void revoke(MPI_Comm comm);
bool is_revoked(MPI_Comm comm);
// A new communicator of the surviving members (collective over them; the
// old one is left for the caller to free). Throws without ULFM.
MPI_Comm shrink(MPI_Comm comm);

}  // namespace moerl::runtime
