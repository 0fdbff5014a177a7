/* Test-only entry points with planted bugs, compiled only into the sanitizer build
   (POWERINFER_SANITIZE, powerinfer_backend/_native/_build.py): they prove that a memory or
   undefined-behaviour error in the library fails the sanitizer job. Never call them in a
   normal process. */
#ifndef PI_SANITIZE_PLANTED_H
#define PI_SANITIZE_PLANTED_H

/* Writes one byte n bytes past the end of a 16-byte heap block (n >= 0: out of bounds). */
int pi_test_oob_write(int n);

/* Returns INT_MAX + n computed in int (n > 0: signed overflow). */
int pi_test_signed_overflow(int n);

#endif
