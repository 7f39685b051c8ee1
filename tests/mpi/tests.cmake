# moerl_mpi_test(NAME RANKS TAG): one line per multi-rank test.
moerl_mpi_test(mailbox 3 "[mailbox]")
moerl_mpi_test(world 4 "[world]")
moerl_mpi_test(stop 4 "[stop]")
moerl_mpi_test(env_worker 3 "[envworker]")
moerl_mpi_test(weight_sync 3 "[sync]")
moerl_mpi_test(coordinator 2 "[coordinator]")
moerl_mpi_test(learner_modes 3 "[learner_modes]")
moerl_mpi_test(learner_dynamic_sampling 3 "[learner_dynamic_sampling]")
