#include "sol.h"
u64 entrypoint(u8 *input) { (void)input; return 0; }
