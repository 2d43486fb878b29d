/* The C ABI (libmlakit_c) from a C program: prints the library's version and ABI version. */
#include <stdio.h>

#include "mlakit/mlakit.h"

int main(void) {
  printf("c_abi_version: mlakit %s, C ABI %d\n", mlakit_version(), (int)mlakit_abi_version());
  return 0;
}
