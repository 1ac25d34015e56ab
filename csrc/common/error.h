// How the core reports bad input: checks throw opente::Error inside an op, and
// run_op() at the C API boundary turns it into a te_status plus a thread-local
// message prefixed with the op's name. No exception crosses the C API.
#pragma once

#include <stdio.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "opente/status.h"

namespace opente {

class Error : public std::runtime_error {
 public:
  Error(te_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  te_status status() const { return status_; }

 private:
  te_status status_;
};

// Message building without iostreams: a libstdc++ linked statically into the
// extension (as one GPU machine's default g++ does) crashed formatting integers
// through std::ostringstream's locale next to the process's own libstdc++.
inline void append_part(std::string& s, const char* part) { s += part ? part : "(null)"; }
inline void append_part(std::string& s, const std::string& part) { s += part; }
inline void append_part(std::string& s, double part) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%g", part);
  s += buf;
}
template <class T, class = std::enable_if_t<std::is_integral_v<T>>>
void append_part(std::string& s, T part) {
  s += std::to_string(part);
}

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::string s;
  (append_part(s, parts), ...);
  return s;
}

[[noreturn]] inline void fail(te_status status, const std::string& message) { throw Error(status, message); }

void set_last_error(const std::string& message);

// Runs `body` and converts what it throws into a status and message "op: what".
template <class Body>
te_status run_op(const char* op, Body&& body) noexcept {
  try {
    body();
    return TE_SUCCESS;
  } catch (const Error& e) {
    set_last_error(concat(op, ": ", e.what()));
    return e.status();
  } catch (const std::exception& e) {
    set_last_error(concat(op, ": internal error: ", e.what()));
    return TE_ERROR_INTERNAL;
  } catch (...) {
    set_last_error(concat(op, ": internal error"));
    return TE_ERROR_INTERNAL;
  }
}

}  // namespace opente

#define OPENTE_CHECK_ARG(cond, ...) \
  do {                              \
    if (!(cond)) ::opente::fail(TE_ERROR_INVALID_ARGUMENT, ::opente::concat(__VA_ARGS__)); \
  } while (0)
