// Portability macros shared by host and device code.
#pragma once

#if defined(__CUDACC__)
#define MXQ_HD __host__ __device__
#define MXQ_HD_INLINE __host__ __device__ __forceinline__
#else
#define MXQ_HD
#define MXQ_HD_INLINE inline
#endif
