# moerl_mpi_test(NAME RANKS TAG) entries; one line per multi-rank test.
