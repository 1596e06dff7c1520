"""Event notification: selector subscriptions, transformations and GET-EVENTS.

Every event is a virtual notification message (:mod:`.message`); a subscriber filters them
with a selector (:mod:`.selector`) and shapes them with a transformation. The doors (AMQP
``$events``, FTN3 ``futoin.evt.notify``, the HTTP feed's ``?selector=``, the CLI) are thin
adapters over the same pieces.
"""
