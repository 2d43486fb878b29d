// `mlakit info`: version, build options, backends, CPU and GPU of this machine.
#pragma once

#include <ostream>

namespace mlakit::cli {

void print_info(std::ostream& os);

}  // namespace mlakit::cli
