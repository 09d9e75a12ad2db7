// Host code gets CXX_FLAGS, not DEVICE_FLAGS.
#ifndef FROM_CXX_FLAGS
#error "CXX_FLAGS did not reach the host compiler"
#endif
#ifdef FROM_DEVICE_FLAGS
#error "DEVICE_FLAGS reached the host compiler"
#endif
int kiln_test_flags_host() { return 1; }
