// A non-owning reference to a callable: one object pointer and one function pointer, never an
// allocation. std::function owns a copy of its target and heap-allocates it past 16 bytes
// (libstdc++'s small-object buffer), which a [&] lambda capturing three references already
// exceeds; parallel_for takes one of these per call, so it takes a FunctionRef instead.
//
// Like std::string_view, it must not outlive what it refers to: take it as a parameter and call
// it during the call, never store it. Binding a temporary lambda in a call's argument list is
// fine (the temporary lives until the end of the full expression).
#pragma once

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace tessera {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  // Any callable object (lambda, functor, function pointer variable) invocable as R(Args...).
  // Functions themselves are not objects: pass &fn.
  template <typename F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> &&
             std::is_object_v<std::remove_reference_t<F>> &&
             std::is_invocable_r_v<R, std::remove_reference_t<F>&, Args...>)
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): binds at call sites
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_(&call<std::remove_reference_t<F>>) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  template <typename F>
  static R call(void* object, Args... args) {
    if constexpr (std::is_void_v<R>)
      std::invoke(*static_cast<F*>(object), std::forward<Args>(args)...);  // drops any result
    else
      return std::invoke(*static_cast<F*>(object), std::forward<Args>(args)...);
  }

  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace tessera
