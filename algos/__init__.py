"""The algorithm files, one self-contained file each, installed as `jaxzoo.algos`
(`from jaxzoo.algos import ppo`). Each also runs as a script, from here or
copied anywhere once the package is installed: `python algos/ppo.py --help`."""
