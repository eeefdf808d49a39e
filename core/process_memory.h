// This process's memory as Linux reports it (/proc/self/status, /proc/self/clear_refs): the
// benchmarks' RSS columns and the tests' peak-RSS bounds read it through here.
#pragma once

namespace tessera {

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM", "RssAnon", "RssFile", ...; the file
// gives kB); -1 when the field is absent or the file unreadable.
double process_status_bytes(const char* field);

// Restarts the peak resident set (VmHWM) from the current RSS ("5" into /proc/self/clear_refs,
// Linux >= 4.0), so a phase can report its own peak. False when the kernel refuses it.
bool reset_peak_rss();

}  // namespace tessera
