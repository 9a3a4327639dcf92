import gc, sys, runpy
if sys.argv[1] == "off": gc.disable()
if sys.argv[1] == "freeze": gc.freeze()
sys.argv = ["prof35.py", sys.argv[2]]
runpy.run_path("prof35.py", run_name="__main__")
