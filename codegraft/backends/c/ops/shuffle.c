
/* Two-vector shuffle with constant indices: gcc >= 12 and clang spell it the same way. */
#if defined(__clang__) || __GNUC__ >= 12
#define CG_SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define CG_SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (vi){__VA_ARGS__})
#endif
