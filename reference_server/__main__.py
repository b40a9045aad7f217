"""`python -m reference_server serve ...`"""

from reference_server.cli import main

main()
