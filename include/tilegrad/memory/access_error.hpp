// The errors a kernel's misuse of memory throws: an access outside a tensor, and a race between
// two programs of a launch (each naming the program, the tensor, the element and the source line).
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>
#include <utility>

namespace tilegrad {

/// An access outside a tensor (or another misuse of memory) by a kernel.
class access_error : public std::out_of_range {
public:
  access_error(std::string const& what, std::string program, std::string tensor,
               std::string element, std::source_location where)
      : std::out_of_range(what), program_(std::move(program)), tensor_(std::move(tensor)),
        element_(std::move(element)), where_(where) {}

  std::string const& program() const { return program_; }
  std::string const& tensor() const { return tensor_; }
  std::string const& element() const { return element_; }
  std::source_location const& where() const { return where_; }

private:
  std::string program_, tensor_, element_;
  std::source_location where_;
};

/// Two programs of one launch touch one element in a way whose result depends on their order
/// (found by vjp, and by a launch that checks for races): both programs, the tensor, the
/// element and the source line of the access that found it.
class race_error : public access_error {
public:
  race_error(std::string const& what, std::string program, std::string other, std::string tensor,
             std::string element, std::source_location where)
      : access_error(what, std::move(program), std::move(tensor), std::move(element), where),
        other_(std::move(other)) {}
  /// The other program of the pair.
  std::string const& other_program() const { return other_; }

private:
  std::string other_;
};

} // namespace tilegrad
