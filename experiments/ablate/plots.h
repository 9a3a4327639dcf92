// Plots of an ablation: scripts/plot_ablation.py (the table as grouped bars with error bars) and, when
// the tree has it, scripts/plot_trace.py on each run's trace. Both need Debian's /usr/bin/python3 with
// matplotlib; without it the ablation says so and makes no plots.
#pragma once

#include <iosfwd>
#include <string>

namespace gradscale::ablate {

// The scripts/ directory: $GRADSCALE_SCRIPTS_DIR, else ../scripts next to the running binary's
// directory (build/gradscale → scripts/), else the source tree the binary was built from. "" if none
// has plot_ablation.py.
std::string find_scripts_dir();

// Whether /usr/bin/python3 can import matplotlib.
bool have_matplotlib();

// Plots DIR/table.csv into DIR/table.png (and, with `trace_plots`, each run's trace next to it).
// Messages (and why there are no plots) go to `log`. Returns whether the table plot was written.
bool make_plots(const std::string& out_dir, bool trace_plots, std::ostream& log);

}  // namespace gradscale::ablate
