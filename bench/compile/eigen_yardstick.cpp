// The yardstick of bench/compile/time.sh: an Eigen file with a dynamic matrix product, to scale
// compile times taken on one machine to another (compile times move by 20-30 % from day to day).
#include <Eigen/Dense>

#include <iostream>

int main() {
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(64, 64), b = Eigen::MatrixXf::Random(64, 64);
  Eigen::MatrixXf c = a * b;
  std::cout << c(0, 0) << "\n";
}
