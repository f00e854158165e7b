/*
 * The create-user protocol over the broker (SENDER_TRANSPORT=nats), for
 * SPIN: outbox.pml's model with the HTTP hop replaced by NATS JetStream.
 *
 * One student's outbox row. The sender claims it, publishes its command
 * to the command stream under a message id, and records the broker's
 * acknowledgement; Users' consumer reads the command, applies it through
 * the inbox with its answer row in one commit, and acknowledges it after;
 * Users' relay publishes the answer to the reply stream; the sender's
 * reply reader applies a batch of replies through its inbox of replies in
 * one transaction and acknowledges them after. A row whose answer wait
 * ends is looked at again: held back while Users has not read its
 * command, published again once it has. An operator redrives a dead row
 * with its key or, after a refusal, a new one.
 *
 * Faults: a process crashes between two of its steps (the sender between
 * its publish and its recording; a crash before it publishes is a lease
 * that runs out, which the Clock has anyway); an acknowledgement
 * is lost (the broker's to the sender, or Users' and the sender's to the
 * broker, whose message is then delivered again); a message is delivered
 * again however often; the de-duplication window closes in time; a node
 * lost is these (its connections drop, what it held unacknowledged is
 * delivered again). A step that is one transaction is one atomic step:
 * a crash inside it is the step not taken. docs/model.md maps each step
 * to the code, and says where the model simplifies.
 *
 * Mutations are compile-time switches (spin -DNAME), each of which
 * model/model_test.go requires to give a counterexample:
 *   ACK_BEFORE_COMMIT     Users acknowledges a command before its commit
 *   ANSWER_OUTSIDE_TX     Users writes the answer row outside the user's transaction, before it
 *   REPLY_TWICE           a reply is applied however often it comes, and overwrites the link
 *   RECORD_BEFORE_ACK     the sender records a publish as done before the broker acknowledges it
 *   FIXED_MSG_ID          the message id is the key alone, the same for the row's whole life
 */

#define MAX_ATTEMPTS  2   /* SENDER_MAX_ATTEMPTS */
#define MAX_REDRIVES  1   /* SENDER_MAX_REDRIVES */
#define MAX_DELIVERED 2   /* USERS_COMMAND_MAX_DELIVERIES */
#define KEYS          2   /* the row's key, and one new-operation's */
#define MSGS          2   /* commands the stream may take over a run */
#define REPLIES       2   /* reply messages */

#ifndef FAULTS
#define FAULTS 2
#endif

#define OTHER 3           /* another person's user, holding the document number */

/* outbox.state */
#define PENDING   1
#define PUBLISHED 2
#define DELIVERED 3
#define DEAD      4

/* outbox.reason_class of a dead row */
#define NO_CLASS  0
#define REFUSED   1
#define EXHAUSTED 2
#define EXPIRED   3
#define CONFLICT  4

/* an answer: what, for which key, which user */
#define GOT_USER    1
#define GOT_REFUSAL 2

/* ---- Student's database ---- */
bool committed;
byte state, class, key, attempts, redrives, linked;
byte publishes;      /* outbox.publishes: recorded publishes and redrives, half the message id */
byte pubMsg;         /* 1 + the stream slot of the last recorded publish (published_seq); 0 none */
bool aged;           /* past SENDER_MAX_AGE */
bool due;            /* available_at has passed */
bool leaseRunning;
bool replySeen[MSGS]; /* reply_inbox: the answers applied, by id (one answer per command) */

/* ---- the command stream ---- */
bool mUsed[MSGS], mAcked[MSGS], mWin[MSGS];
byte mKey[MSGS], mId[MSGS], mDeliveries[MSGS];
byte mEpoch[MSGS];   /* ghost: the redrives the row had when the command was published */
byte nMsgs;

/* ---- Users' database ---- */
bool answered[KEYS]; /* the inbox holds the key's answer */
byte answer[KEYS];   /* its user, or 0 for a refusal */
byte users;
bool otherHolds;
bool poison;         /* the row's command is one Users cannot read */
/* Users' outbox of answers: one row per command message, by its slot */
bool aUsed[MSGS];
byte aKey[MSGS], aUser[MSGS];  /* aUser 0: a refusal */

/* ---- the reply stream ---- */
bool rAcked[REPLIES];
byte rAnswer[REPLIES];  /* the answer it carries */
byte nReplies;

byte faults = FAULTS;
bool senderBusy;     /* between its claim and its recording */
byte handling;       /* 1 + the command Users is working on; 0 none */
bool publishing;     /* the sender has claimed the row and not yet heard from the broker */
byte nextKey = 1;
byte epoch;          /* ghost: redrives so far */
bool swallowed;      /* ghost: a publish after a redrive dropped as a copy of one before it */
byte links;          /* ghost: times a reply wrote the student's link */

/* the message id of the row's next publish: its key and its count of publishes */
#ifdef FIXED_MSG_ID
#define msgId (key * 4)
#else
#define msgId (key * 4 + publishes)
#endif

#define settled ((state == DELIVERED && linked != 0) || state == DEAD)
#define orphan(u) (users >= u && linked != u && (state == DELIVERED || (state == DEAD && class == REFUSED)))
#define documentTaken (otherHolds || users > 0)
/* a command Users may read now */
#define readable(i) (i < nMsgs && !mAcked[i])

/* ---------------------------------------------------------------------
 * Student: the student and its outbox row, with key K0, in one commit.
 */
active proctype Student() {
	atomic {
		committed = true; state = PENDING; key = 0; due = true;
		printf("MSG: Student commits the student and its outbox row with key K0\n")
	}
}

/* ---------------------------------------------------------------------
 * The sender's loop (relay.Engine with usersnats.Deliver, then
 * store.Record's RecordPublished, ScheduleRetries or MarkDead). Three
 * steps: the claim, the publish, the recording; a crash between two of
 * them forgets the claim, whose lease runs out.
 */
inline recordPublished(slot, repeat) {
	if
	:: state == PENDING && leaseRunning ->
		state = PUBLISHED; pubMsg = slot + 1; publishes++; due = false; leaseRunning = false;
		if
		:: repeat -> attempts--;
			if
			:: mEpoch[slot] < epoch -> swallowed = true;
				printf("MSG: the publish after the redrive was dropped as a copy of M%d, published before it\n", slot)
			:: else -> skip
			fi
		:: else -> skip
		fi;
		printf("MSG: the sender records the row published as M%d; it waits for Users' answer\n", slot)
	:: else -> printf("MSG: the sender records nothing: the row is no longer its to record\n")
	fi
}

active proctype Sender() {
	byte i, slot, myKey, myId;
	bool acked, repeat;
end_idle:
	do
	:: atomic {
		committed && (state == PENDING || state == PUBLISHED) && due && !leaseRunning ->
		state = PENDING; leaseRunning = true; attempts++; due = false; senderBusy = true; publishing = true;
		myKey = key; myId = msgId;
		printf("MSG: the sender claims the row (attempt %d, key K%d)\n", attempts, myKey)
	   };
	   if
	   :: atomic { aged ->
		/* MarkDead, fenced by the lease like every recording */
		if
		:: state == PENDING && leaseRunning -> state = DEAD; class = EXPIRED; leaseRunning = false;
			printf("MSG: the row is past its max age: dead-lettered, expired\n")
		:: else -> printf("MSG: the sender records nothing: the row is no longer its to record\n")
		fi }
	   :: atomic { !aged && pubMsg != 0 && !mAcked[pubMsg - 1] ->
		/* Deliver's look at the consumer: Users has not read it;
		 * RecordPublished keeps the last publish, fenced */
		if
		:: state == PENDING && leaseRunning -> state = PUBLISHED; attempts--; leaseRunning = false;
			printf("MSG: the sender finds M%d unread by Users: publishes nothing, waits again\n", pubMsg - 1)
		:: else -> skip
		fi }
	   :: !aged && (pubMsg == 0 || mAcked[pubMsg - 1]) ->
#ifdef RECORD_BEFORE_ACK
		atomic { recordPublished(nMsgs, false) };
#endif
		/* natsbus.Publish: the broker stores the command, or drops a
		 * copy of one it holds under the same id */
		atomic {
			slot = MSGS; repeat = false; i = 0;
			do
			:: i < nMsgs && mWin[i] && mId[i] == myId -> slot = i; repeat = true; break
			:: i < nMsgs && !(mWin[i] && mId[i] == myId) -> i++
			:: i >= nMsgs -> break
			od;
			if
			:: !repeat && nMsgs < MSGS ->
				slot = nMsgs; nMsgs++; mUsed[slot] = true; mKey[slot] = myKey; mId[slot] = myId; mWin[slot] = true;
				mEpoch[slot] = epoch;
				printf("MSG: the broker stores the command as M%d (key K%d)\n", slot, myKey)
			:: !repeat && nMsgs < MSGS && faults > 0 -> faults--;
				printf("MSG: the broker is unreachable: nothing is stored\n")
			:: !repeat && nMsgs >= MSGS -> skip   /* the model's bound: nothing taken */
			:: repeat -> printf("MSG: the broker drops the publish as a copy of M%d\n", slot)
			fi;
			if
			:: slot < MSGS -> acked = true
			:: slot < MSGS && faults > 0 -> faults--; acked = false;
				printf("MSG: the broker's acknowledgement is lost\n")
			:: slot == MSGS -> acked = false
			fi;
			i = 0; publishing = false
		};
		if
		:: atomic { faults > 0 -> faults--;
			printf("MSG: the sender crashes before it records the publish\n") }
		:: skip ->
		atomic {
			if
			:: acked ->
#ifndef RECORD_BEFORE_ACK
				recordPublished(slot, repeat)
#else
				skip
#endif
			:: !acked && state == PENDING && leaseRunning && attempts >= MAX_ATTEMPTS ->
				state = DEAD; class = EXHAUSTED; leaseRunning = false;
				printf("MSG: no acknowledgement, attempts used up: the sender dead-letters the row\n")
			:: !acked && state == PENDING && leaseRunning && attempts < MAX_ATTEMPTS ->
				leaseRunning = false;
				printf("MSG: no acknowledgement: the sender schedules a retry\n")
			:: else -> skip   /* recorded already, or no longer its to record */
			fi
		}
		fi
	   fi;
	   atomic { senderBusy = false; publishing = false; slot = 0; i = 0; myKey = 0; myId = 0; acked = false; repeat = false }
	od
}

/* Users' relay of answers (usersvc relay) publishes a new answer row to
 * the reply stream under the answer's own id. It is folded into the
 * commit that writes the row: the relay's own delay changes nothing the
 * reader can see (a reply may still overtake the sender's recording of
 * its publish), and a reply it publishes twice (a crash before it marks
 * the row) is a reply delivered again, which the reader's lost
 * acknowledgement makes as well. */
inline relay(a) {
	if
	:: nReplies < REPLIES -> rAnswer[nReplies] = a; nReplies++;
		printf("MSG: Users' relay publishes answer A%d as reply R%d\n", a, nReplies - 1)
	:: else -> skip
	fi
}

/* ---------------------------------------------------------------------
 * Users' command consumer (usersvc commands.handle): one delivery of a
 * command; inbox.Do, the user and the answer row in one commit, then the
 * acknowledgement. A crash before the commit is a delivery that did
 * nothing; the broker delivers the command again.
 */
inline commit(i, k) {
	if
	:: !answered[k] ->
		if
		:: documentTaken -> answer[k] = 0;
			printf("MSG: Users refuses K%d: the document number is taken\n", k)
		:: else -> users++; answer[k] = users;
			printf("MSG: Users creates user U%d for K%d\n", users, k)
		fi;
		answered[k] = true
	:: else -> printf("MSG: Users replays K%d's stored answer\n", k)
	fi;
	if
	:: !aUsed[i] -> aUsed[i] = true; aKey[i] = k; aUser[i] = answer[k]; relay(i)
	:: else -> skip   /* this message's answer exists: ON CONFLICT DO NOTHING */
	fi
}

active proctype Consumer() {
	byte i, k, u;
end_idle:
	do
	:: atomic {
		(readable(0) || readable(1)) ->
		if
		:: readable(0) -> i = 0
		:: readable(1) -> i = 1
		fi;
		k = mKey[i]; handling = i + 1;
		if
		:: poison -> mDeliveries[i]++   /* counted for the cap; else nothing reads it */
		:: else -> skip
		fi;
		printf("MSG: the broker delivers M%d to Users\n", i)
	   };
	   if
	   :: atomic { poison && mDeliveries[i] < MAX_DELIVERED ->
		printf("MSG: Users cannot read M%d and hands it back\n", i) }
	   :: atomic { poison && mDeliveries[i] >= MAX_DELIVERED -> mAcked[i] = true;
		printf("MSG: Users parks M%d, which it cannot read, and terminates it\n", i) }
	   :: atomic { !poison && aged -> mAcked[i] = true;
		printf("MSG: Users reads M%d after its row expired: terminated, not acted on\n", i) }
	   :: !poison && !aged ->
#ifdef ACK_BEFORE_COMMIT
		atomic { mAcked[i] = true; printf("MSG: Users acknowledges M%d\n", i) };
		if
		:: atomic { commit(i, k) }
		:: atomic { faults > 0 -> faults--; printf("MSG: Users crashes before its commit\n") }
		fi
#else
#ifdef ANSWER_OUTSIDE_TX
		/* the user's id is known before its transaction: the answer goes first */
		atomic {
			if
			:: !answered[k] && !aUsed[i] && !documentTaken -> aUsed[i] = true; aKey[i] = k; aUser[i] = users + 1;
				printf("MSG: Users writes M%d's answer, U%d, before the user's transaction\n", i, users + 1);
				relay(i)
			:: else -> skip
			fi
		};
		if
		:: atomic { faults > 0 -> faults--; printf("MSG: Users crashes before the user's transaction\n") }
		:: skip ->
#endif
		atomic {
			commit(i, k);
			if
			:: mAcked[i] = true; printf("MSG: Users commits and acknowledges M%d\n", i)
			:: faults > 0 -> faults--; printf("MSG: Users commits; its acknowledgement of M%d is lost\n", i)
			fi
		}
#ifdef ANSWER_OUTSIDE_TX
		fi
#endif
#endif
	   fi;
	   atomic { i = 0; k = 0; u = 0; handling = 0 }
	od
}

/* ---------------------------------------------------------------------
 * The sender's reply reader (usersnats.Replies, store.ApplyReplies): the
 * replies read together, in one transaction through the inbox of
 * replies, acknowledged after; an acknowledgement lost is a reply
 * delivered again.
 */
inline apply(j) {
	a = rAnswer[j];
#ifndef REPLY_TWICE
	if
	:: replySeen[a] -> printf("MSG: the inbox of replies holds answer A%d already: a repeat\n", a)
	:: !replySeen[a] -> replySeen[a] = true;
		if
		:: aKey[a] != key -> printf("MSG: answer A%d is for another key: unmatched\n", a)
		:: aKey[a] == key && aUser[a] != 0 && (state == PENDING || state == PUBLISHED || (state == DEAD && class != CONFLICT)) ->
			if
			:: linked == 0 || linked == aUser[a] -> linked = aUser[a]; state = DELIVERED; class = NO_CLASS; leaseRunning = false; links++;
				printf("MSG: the sender links the student to U%d from answer A%d\n", aUser[a], a)
			:: else -> state = DEAD; class = CONFLICT; leaseRunning = false;
				printf("MSG: answer A%d names another user than the student's: conflict\n", a)
			fi
		:: aKey[a] == key && aUser[a] == 0 && (state == PENDING || state == PUBLISHED) ->
			state = DEAD; class = REFUSED; leaseRunning = false;
			printf("MSG: the sender dead-letters the row from answer A%d: refused\n", a)
		:: else -> printf("MSG: answer A%d finds the row settled\n", a)
		fi
	fi
#else
	if
	:: aKey[a] == key && aUser[a] != 0 -> linked = aUser[a]; state = DELIVERED; class = NO_CLASS; leaseRunning = false; links++;
		printf("MSG: the sender links the student to U%d from answer A%d, as often as it comes\n", aUser[a], a)
	:: aKey[a] == key && aUser[a] == 0 -> state = DEAD; class = REFUSED; leaseRunning = false;
		printf("MSG: the sender dead-letters the row from answer A%d\n", a)
	:: else -> skip
	fi
#endif
}

active proctype Reader() {
	byte a;
	bool lost;
end_idle:
	do
	:: atomic {
		(0 < nReplies && !rAcked[0]) || (1 < nReplies && !rAcked[1]) ->
		lost = false;
		if
		:: faults > 0 -> faults--; lost = true
		:: skip
		fi;
		if
		:: 0 < nReplies && !rAcked[0] && 1 < nReplies && !rAcked[1] ->
			/* a batch of two, one transaction */
			apply(0); apply(1);
			if
			:: !lost -> rAcked[0] = true; rAcked[1] = true
			:: lost -> printf("MSG: the sender's acknowledgements of R0 and R1 are lost\n")
			fi
		:: 0 < nReplies && !rAcked[0] ->
			apply(0);
			if
			:: !lost -> rAcked[0] = true
			:: lost -> printf("MSG: the sender's acknowledgement of R0 is lost\n")
			fi
		:: 1 < nReplies && !rAcked[1] ->
			apply(1);
			if
			:: !lost -> rAcked[1] = true
			:: lost -> printf("MSG: the sender's acknowledgement of R1 is lost\n")
			fi
		fi;
		a = 0; lost = false
	   }
	od
}

/* ---------------------------------------------------------------------
 * The operator (deadletter.Redrive): retry with the key, or after a
 * refusal a new operation with a new key; each redrive counts as a
 * publish, so the next message id is new. And the other user holding the
 * document number may be disabled.
 */
active proctype Operator() {
end_idle:
	do
	:: atomic { state == DEAD && redrives < MAX_REDRIVES ->
		state = PENDING; class = NO_CLASS; attempts = 0; aged = false; redrives++; epoch++;
		publishes++; pubMsg = 0; due = true; leaseRunning = false;
		printf("MSG: the operator redrives the row with its key K%d (retry)\n", key) }
	:: atomic { state == DEAD && class == REFUSED && redrives < MAX_REDRIVES && nextKey < KEYS ->
		key = nextKey; nextKey++;
		state = PENDING; class = NO_CLASS; attempts = 0; aged = false; redrives++; epoch++;
		publishes++; pubMsg = 0; due = true; leaseRunning = false;
		printf("MSG: the operator redrives the row with a new key K%d (new-operation)\n", key) }
	:: atomic { otherHolds -> otherHolds = false;
		printf("MSG: the operator disables the other user holding the document number\n") }
	od
}

/* ---------------------------------------------------------------------
 * Time: a wait ends (an answer wait, a backoff); the lease of a sender
 * that crashed runs out; the row passes its max age; a command's
 * de-duplication window closes. (Keys Users forgets are outbox.pml's.)
 */
active proctype Clock() {
end_idle:
	do
	:: atomic { (state == PENDING || state == PUBLISHED) && !due && !leaseRunning -> due = true;
		printf("MSG: the row's wait ends: it is due\n") }
	:: atomic { leaseRunning && !senderBusy -> leaseRunning = false;
		printf("MSG: the lease runs out: its sender crashed\n") }
	:: atomic { (state == PENDING || state == PUBLISHED) && !aged -> aged = true;
		printf("MSG: the row passes SENDER_MAX_AGE\n") }
	:: atomic { mWin[0] -> mWin[0] = false; printf("MSG: M0's de-duplication window closes\n") }
	:: atomic { mWin[1] -> mWin[1] = false; printf("MSG: M1's de-duplication window closes\n") }
	od
}

init {
	if
	:: otherHolds = true
	:: otherHolds = false
	fi;
	if
	:: poison = true
	:: poison = false
	fi
}

/* ---- properties ---- */

/* at most one user per operation: one per student, over all its keys */
ltl one_user { [] (users <= 1) }
/* a linked student holds a user created under one of its keys */
ltl right_user { [] (linked == 0 || (linked != OTHER && linked <= users)) }
/* no row is settled while a user made for its student is someone else's or nobody's */
ltl no_orphan { [] !(orphan(1) || orphan(2)) }
/* once the faults are spent, every row ends linked or dead and stays so */
ltl settles { <> [] settled }
/* a redrive reaches Users: no publish after a redrive is dropped as a copy of one before it */
ltl redrive_reaches { [] !swallowed }
/* a row waits as published only for a command the broker holds unread,
 * that Users is working on, or whose answer Users has committed: never
 * for nothing (a command Users cannot read, or read after its row
 * expired, is set aside on purpose). The moments a process is between
 * two of its steps on it do not count: only where a step can leave it. */
ltl no_lost_command { [] ((state == PUBLISHED && !due && !aged && !poison && pubMsg != 0 && !publishing) ->
	((mUsed[pubMsg - 1] && !mAcked[pubMsg - 1]) || handling == pubMsg || answered[mKey[pubMsg - 1]])) }
/* a reply settles its row once: however often the broker delivers it, the settlement is written and counted once */
ltl reply_once { [] (links <= 1) }
