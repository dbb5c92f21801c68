/* Compile-time convolution geometry shared by conv_igemm.cl and
 * depthwise.cl: kernel KH x KW, stride SH SW, padding PH PW, dilation DH DW
 * (ops/conv.py and ops/depthwise.py always pass all eight; the defaults
 * describe a plain 1x1 convolution). */
#ifndef CAFFE_OCL_CONV_GEOM_H
#define CAFFE_OCL_CONV_GEOM_H

#ifndef KH
#define KH 1
#endif
#ifndef KW
#define KW 1
#endif
#ifndef SH
#define SH 1
#endif
#ifndef SW
#define SW 1
#endif
#ifndef PH
#define PH 0
#endif
#ifndef PW
#define PW 0
#endif
#ifndef DH
#define DH 1
#endif
#ifndef DW
#define DW 1
#endif

#endif
