/* Which main loop gemm.cl includes, and its work-group size (for
 * reqd_work_group_size): tile_mainloop.h,
 * TM * TN / MICRO^2 work-items (MICRO 8, or 4 on 64 x 64 tiles), or with ASYNC == 1 (TF32 on NVIDIA, chosen by
 * ops/gemm.py async_tiles) tile_mainloop_async.h, (TM / 64) * (TN / WN)
 * warps. Included after TM, TN (and TF32) are set. */
#ifndef ASYNC
#define ASYNC 0
#endif
#ifndef WN
#define WN 64
#endif
#ifndef MICRO
#define MICRO 8
#endif
#if ASYNC
#define WG_SIZE ((TM / 64) * (TN / WN) * 32)
#define TILE_MAINLOOP "tile_mainloop_async.h"
#else
#define WG_SIZE (TM * TN / (MICRO * MICRO))
#define TILE_MAINLOOP "tile_mainloop.h"
#endif
