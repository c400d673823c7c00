// The machinery that TILEGRAD_SEPARATE_COMPILATION=1 leaves out of every other translation unit:
// include this header in exactly one .cpp file of a program built with that macro (see
// core/config.hpp), first, in a file of its own.
#pragma once

#if defined(TILEGRAD_MACHINERY) && !defined(TILEGRAD_SEPARATE_SOURCE)
#error "include <tilegrad/separate.hpp> first, in a file of its own (its definitions depend on it)"
#endif
#if defined(TILEGRAD_SEPARATE_COMPILATION) && !TILEGRAD_SEPARATE_COMPILATION
#error "tilegrad/separate.hpp belongs to a program built with TILEGRAD_SEPARATE_COMPILATION=1"
#endif
#undef TILEGRAD_SEPARATE_COMPILATION
#define TILEGRAD_SEPARATE_COMPILATION 1
#define TILEGRAD_SEPARATE_SOURCE 1

#include "tilegrad/tilegrad.hpp"

namespace tilegrad {
template class tensor<float>;
template class tensor<float const>;
template class tensor<double>;
template class tensor<double const>;
template class tensor<bf16>;
template class tensor<bf16 const>;
template class tensor<std::byte const>;
template class owned_tensor<float>;
template class owned_tensor<double>;
template class owned_tensor<bf16>;
template erased_gradient erase_gradient<float const>(std::string, tensor<float const>);
template erased_gradient erase_gradient<float>(std::string, tensor<float>);
template erased_gradient erase_gradient<double const>(std::string, tensor<double const>);
template erased_gradient erase_gradient<double>(std::string, tensor<double>);
template erased_gradient erase_gradient<bf16 const>(std::string, tensor<bf16 const>);
template erased_gradient erase_gradient<bf16>(std::string, tensor<bf16>);
template class backward_context<float>;
template class backward_context<double>;
template class backward_context<bf16>;
namespace ad {
template struct load_record<float>;
template struct load_record<double>;
template float* record_load<float>(program_state&, tensor_entry const&, void const*, int,
                                   std::source_location const&);
template double* record_load<double>(program_state&, tensor_entry const&, void const*, int,
                                     std::source_location const&);
template void record_write<float>(program_state&, tensor_entry const&, void const*, access_kind,
                                  float*, std::source_location const&);
template void record_write<double>(program_state&, tensor_entry const&, void const*, access_kind,
                                   double*, std::source_location const&);
template gradients<float> vjp_core<float>(launch_options const&, grid, std::vector<tensor_entry>&,
                                          std::vector<std::string> const&,
                                          tilegrad::detail::program_call,
                                          tilegrad::detail::launch_tracker&,
                                          std::vector<tilegrad::detail::arg_layout> const&);
template gradients<double> vjp_core<double>(launch_options const&, grid, std::vector<tensor_entry>&,
                                            std::vector<std::string> const&,
                                            tilegrad::detail::program_call,
                                            tilegrad::detail::launch_tracker&,
                                            std::vector<tilegrad::detail::arg_layout> const&);
} // namespace ad
namespace detail {
template saved_values make_saved_values<float>(std::string, tensor<float>, double const*);
template saved_values make_saved_values<double>(std::string, tensor<double>, double const*);
template saved_values make_saved_values<bf16>(std::string, tensor<bf16>, double const*);
template saved_values make_moved_inputs<float>(std::string, tensor<float>);
template saved_values make_moved_inputs<double>(std::string, tensor<double>);
template saved_values make_moved_inputs<bf16>(std::string, tensor<bf16>);
template kept_contents keep_contents<float>(std::string, tensor<float>);
template kept_contents keep_contents<double>(std::string, tensor<double>);
template kept_contents keep_contents<bf16>(std::string, tensor<bf16>);
template check_report check_backward_core<float>(grid const&, forward_parts<float>&,
                                                 backward_ref<float>, check_options const&);
template check_report check_backward_core<double>(grid const&, forward_parts<double>&,
                                                  backward_ref<double>, check_options const&);
template check_report check_backward_core<bf16>(grid const&, forward_parts<bf16>&,
                                                backward_ref<bf16>, check_options const&);
} // namespace detail
} // namespace tilegrad
