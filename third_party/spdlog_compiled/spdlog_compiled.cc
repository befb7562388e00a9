// The out-of-line halves of spdlog 1.10 and fmt 9.1 as Debian 12 installs them (the *-inl.h headers), compiled
// in this one file. With SPDLOG_COMPILED_LIB and without FMT_HEADER_ONLY the public headers only declare these
// functions and the class templates below; the explicit instantiations are the ones the agent and its tests
// use (the default logger's colour sink, stderr loggers, the ostream sink).

#include <fmt/format-inl.h>

#include <mutex>

#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/sinks/stdout_color_sinks-inl.h>
#include <spdlog/sinks/stdout_sinks-inl.h>
#include <spdlog/spdlog-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API void buffer<char>::append(const char*, const char*);
template FMT_API void vformat_to(buffer<char>&, string_view, basic_format_args<FMT_BUFFER_CONTEXT(char)>,
                                 locale_ref);
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
template FMT_API void buffer<wchar_t>::append(const wchar_t*, const wchar_t*);
}  // namespace detail
FMT_END_NAMESPACE

namespace spdlog {
template logger::logger(std::string name, sinks_init_list::iterator begin, sinks_init_list::iterator end);

namespace sinks {
template class base_sink<std::mutex>;
template class base_sink<details::null_mutex>;
template class ansicolor_sink<details::console_mutex>;
template class ansicolor_stdout_sink<details::console_mutex>;
template class ansicolor_stderr_sink<details::console_mutex>;
template class stdout_sink_base<details::console_mutex>;
template class stdout_sink<details::console_mutex>;
template class stderr_sink<details::console_mutex>;
}  // namespace sinks

template std::shared_ptr<logger> stderr_logger_mt<synchronous_factory>(const std::string& logger_name);
}  // namespace spdlog
