#include <iostream>

int main() {
  std::cout << "mlakit " << MLAKIT_VERSION << "\n";
  return 0;
}
