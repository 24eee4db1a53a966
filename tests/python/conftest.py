import os
import sys

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
sys.path.insert(0, os.path.join(BUILD, 'python'))
